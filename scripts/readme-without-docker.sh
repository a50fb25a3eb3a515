#!/usr/bin/env bash
# The README's two commands (install and run a sample; run the tests), exactly as written, on a
# fresh machine without Docker: a clean container of BASE_IMAGE with no Docker socket, a copy of
# this checkout and nothing installed. Docker tests must be skipped there (with their reason),
# everything else must pass. Then docs/first-model.md is walked through the same way.
#
#   BASE_IMAGE=abeja-runtime-base:bookworm bash scripts/readme-without-docker.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}

# The first two ```sh blocks of the README: the quick start and the test command.
mapfile -t COMMANDS < <(awk '/^```sh/{inside=1; n++; next} /^```/{inside=0} inside && n<=2' README.md)
if [ "${#COMMANDS[@]}" -ne 2 ]; then
    echo "expected the README to start with two commands, found ${#COMMANDS[@]}" >&2
    exit 1
fi
echo "run:  ${COMMANDS[0]}"
echo "test: ${COMMANDS[1]}"

# A copy of what is committed (no caches, no local state), read-only in the container.
SNAPSHOT=$(mktemp -d)
trap 'rm -rf "$SNAPSHOT"' EXIT
git archive HEAD | tar -x -C "$SNAPSHOT"

docker run --rm --network bridge -v "$SNAPSHOT":/snapshot:ro \
    -e RUN_COMMAND="${COMMANDS[0]}" -e TEST_COMMAND="${COMMANDS[1]}" "$BASE_IMAGE" \
    bash -euo pipefail -c '
        cp -r /snapshot /repo && cd /repo
        test ! -S /var/run/docker.sock
        echo "== the two commands, typed one after the other in one shell"
        printf "%s\n" "$RUN_COMMAND" "echo \"== the test command\"" "$TEST_COMMAND" > /tmp/typed.sh
        bash -e /tmp/typed.sh 2>&1 | tee /tmp/typed.out
        grep -q "\"total\": 108.0" /tmp/typed.out
        echo "== docs/first-model.md, step by step (curl as a user would have it)"
        apt-get update -qq && apt-get install -y -qq curl > /dev/null
        cd /repo && python scripts/first_model_walkthrough.py
    '
