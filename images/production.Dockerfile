# A production image: a project image (images/project.Dockerfile: runtime + requirements +
# project, no mount) made to run unattended, read-only and as a non-root user.
#
# Built by `abeja model build` on top of the project image that run-local also uses, so a
# project tried locally builds for production in seconds. Runs with plain
# `docker run --read-only --tmpfs /tmp -p 5000:5000 -p 5001:5001 IMAGE`; every runtime option
# is an environment variable (`-e ABEJA_RUNTIME_WORKERS=2`).
ARG PROJECT_IMAGE
FROM ${PROJECT_IMAGE}

# The root filesystem is read-only at run time: compile bytecode now, and make the code readable
# (not writable) by the runtime's user whatever the permissions were on the build machine.
RUN python -m compileall -q -j 0 /srv/app "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null \
    ; chmod -R a+rX /srv/app

ARG HANDLER=main:handler
# HOME and TMPDIR on the one writable path (`--tmpfs /tmp`, or an emptyDir on Kubernetes).
ENV HANDLER=${HANDLER} \
    HOME=/tmp \
    TMPDIR=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric user, so that Kubernetes can check runAsNonRoot without a passwd entry.
USER 10001:10001
WORKDIR /srv/app
EXPOSE 5000 5001
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-m", "abeja_runtime.probe"]
# The runtime is PID 1: it handles SIGTERM (drain, exit 0) and reaps its own workers.
CMD ["abeja-runtime"]
