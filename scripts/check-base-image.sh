#!/usr/bin/env bash
# Check that a base image made by make-base-image.sh works like python:slim
# in a Dockerfile: a RUN step can `pip install` a package from PyPI and
# `python` can import it. Builds a throwaway image and removes it again.
#
# Usage: scripts/check-base-image.sh [NAME:TAG]   (default abeja-runtime-base:bookworm)
set -euo pipefail

IMAGE="${1:-abeja-runtime-base:bookworm}"
TEST_TAG="abeja-runtime-base-selftest:$$"

log() { echo "[check-base-image] $*" >&2; }

CTX=$(mktemp -d /tmp/abeja-base-check.XXXXXX)
cleanup() {
    docker image rm -f "$TEST_TAG" >/dev/null 2>&1 || true
    rm -rf "$CTX"
}
trap cleanup EXIT

cat >"$CTX/Dockerfile" <<EOF
FROM $IMAGE
RUN python --version && pip --version \\
 && pip install --no-cache-dir six \\
 && python -c "import six; print('six', six.__version__, 'imported OK')"
EOF

# Legacy builder on purpose: the Docker engine here has no buildx plugin.
if ! docker build --rm --force-rm --pull=false -t "$TEST_TAG" "$CTX" >"$CTX/build.log" 2>&1; then
    tail -n 40 "$CTX/build.log" >&2
    log "FAILED: a Dockerfile FROM $IMAGE could not 'pip install six' from PyPI"
    exit 1
fi
# (the RUN output may carry terminal colour codes from pip's warnings)
grep -aE '(^Python |^pip |six .* imported OK)' "$CTX/build.log" | sed 's/^.*\(six \)/\1/; s/^/[check-base-image]   /' >&2 || true
log "OK: $IMAGE can pip install from PyPI in a RUN step"
