#!/usr/bin/env bash
# Build a local Debian bookworm + Python 3 base image without pulling from any
# container registry (none is reachable here). It is meant to behave like the
# official python:*-slim images for Dockerfiles: `python`, `pip install <pkg>`
# work in a RUN step.
#
# Usage: scripts/make-base-image.sh [NAME:TAG]   (default abeja-runtime-base:bookworm)
#
# Idempotent: skips the build when NAME:TAG exists and was made by the same
# recipe with the same host CA bundle (both recorded as image labels). The
# host's CA bundle is baked in because HTTPS to PyPI goes through an egress
# proxy whose CA lives only in the host's bundle.
#
# Env overrides: DEBIAN_MIRROR (default: the bookworm mirror apt uses here),
#                FORCE_BASE_IMAGE_REBUILD=1 (rebuild even if up to date).
set -euo pipefail

IMAGE="${1:-abeja-runtime-base:bookworm}"
SUITE=bookworm
# Bump when the recipe below changes, so cached images get rebuilt.
RECIPE_VERSION=1
PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
HOST_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

log() { echo "[make-base-image] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap needs it)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install -y debootstrap)"
command -v docker >/dev/null || die "docker CLI is not installed"
docker info >/dev/null 2>&1 || die "Docker engine is not answering (docker info failed)"
[ -s "$HOST_CA_BUNDLE" ] || die "host CA bundle $HOST_CA_BUNDLE is missing"

ca_sha=$(sha256sum "$HOST_CA_BUNDLE" | cut -d' ' -f1)

old_id=""
if old_id=$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null); then
    have_recipe=$(docker image inspect --format '{{ index .Config.Labels "abeja-runtime.base.recipe" }}' "$IMAGE" 2>/dev/null || true)
    have_ca=$(docker image inspect --format '{{ index .Config.Labels "abeja-runtime.base.ca-sha256" }}' "$IMAGE" 2>/dev/null || true)
    if [ "${FORCE_BASE_IMAGE_REBUILD:-0}" != 1 ] && [ "$have_recipe" = "$RECIPE_VERSION" ] && [ "$have_ca" = "$ca_sha" ]; then
        log "$IMAGE already exists and is up to date ($old_id); skipping"
        exit 0
    fi
    if [ "${FORCE_BASE_IMAGE_REBUILD:-0}" = 1 ]; then
        log "$IMAGE exists; FORCE_BASE_IMAGE_REBUILD=1, rebuilding"
    else
        log "$IMAGE exists but is stale (recipe '$have_recipe', want '$RECIPE_VERSION'; CA bundle changed: $([ "$have_ca" = "$ca_sha" ] && echo no || echo yes)); rebuilding"
    fi
else
    old_id=""
fi

# The bookworm mirror apt is configured with on this machine (deb822 .sources
# or one-line .list), falling back to deb.debian.org.
detect_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk -v suite="$SUITE" '
            function flush() { if (uris != "" && ok) { split(uris, u, " "); print u[1]; exit } uris=""; ok=0 }
            /^[[:space:]]*$/ { flush(); next }
            /^URIs:/   { sub(/^URIs:[[:space:]]*/, ""); uris=$0 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) ok=1 }
            END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        # deb [opts] URL SUITE COMPONENTS...
        sed -e 's/\[[^]]*\]//' "$f" | awk -v suite="$SUITE" '$1 == "deb" && $3 == suite { print $2 }'
    done
}
MIRROR="${DEBIAN_MIRROR:-$(detect_mirror | head -n1)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

WORK=$(mktemp -d /var/tmp/abeja-base-image.XXXXXX)
ROOTFS="$WORK/rootfs"
cleanup() {
    # debootstrap mounts proc/sys inside the target; if it died half-way they
    # may still be mounted, so unmount (deepest first) before deleting.
    local m
    for m in $(awk -v p="$WORK/" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
    rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT

log "debootstrap $SUITE from $MIRROR into $ROOTFS (log: $WORK/debootstrap.log)"
if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" \
        >"$WORK/debootstrap.log" 2>&1; then
    tail -n 40 "$WORK/debootstrap.log" >&2 || true
    [ -f "$ROOTFS/debootstrap/debootstrap.log" ] && tail -n 40 "$ROOTFS/debootstrap/debootstrap.log" >&2
    die "debootstrap failed"
fi

# CA trust: the full host bundle (used directly by pip via PIP_CERT and by
# OpenSSL's default path), plus the host's local CAs so that a later
# update-ca-certificates inside a Dockerfile keeps them.
cp "$HOST_CA_BUNDLE" "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$ROOTFS/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
fi

# Like python:slim: plain `pip install` into the system interpreter works.
rm -f "$ROOTFS"/usr/lib/python3*/EXTERNALLY-MANAGED

# Slim it down a little: package caches and lists are not needed in the image.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
       "$ROOTFS"/var/log/* "$ROOTFS"/debootstrap 2>/dev/null || true

# Sanity-check before importing.
for bin in python python3 pip pip3; do
    [ -e "$ROOTFS/usr/bin/$bin" ] || die "$bin missing from rootfs"
done

log "importing rootfs as $IMAGE"
new_id=$(tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
    --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' \
    --change "LABEL abeja-runtime.base.recipe=$RECIPE_VERSION" \
    --change "LABEL abeja-runtime.base.ca-sha256=$ca_sha" \
    --change "LABEL abeja-runtime.base.mirror=$MIRROR" \
    --change 'CMD ["python3"]' \
    --message "abeja-runtime base: debootstrap $SUITE minbase + $PACKAGES" \
    - "$IMAGE")
log "built $IMAGE ($new_id)"

# Drop the stale image this script made earlier, if nothing else uses it.
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
    docker image rm "$old_id" >/dev/null 2>&1 && log "removed stale image $old_id" || true
fi
