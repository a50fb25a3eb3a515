# A project image: the runtime image + the project's requirements.txt + the project itself.
#
# Built by the abeja CLI with a context of this file, abeja-build/requirements.txt (empty when
# the project has none) and project/ (the project folder without VCS data and caches).
# Requirements come first so that editing code does not reinstall them.
ARG RUNTIME_IMAGE=abeja-runtime
FROM ${RUNTIME_IMAGE}

WORKDIR /srv/app
# Cortex's handlers read their project at /mnt/project ("the contents of the project directory
# is available in /mnt/project/"): the same folder under both names.
RUN mkdir -p /mnt && ln -sfn /srv/app /mnt/project
COPY abeja-build/requirements.txt /srv/app/requirements.txt
RUN if [ -s requirements.txt ]; then \
        python -m pip install --no-cache-dir --disable-pip-version-check -r requirements.txt; \
    fi
COPY project/ /srv/app/
