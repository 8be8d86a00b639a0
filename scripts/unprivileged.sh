#!/usr/bin/env bash
# Runs a command (a compiled test binary) as the unprivileged test user, with no
# capabilities: the unit tier's target runner (scripts/test.sh unit sets it as cargo's
# CARGO_TARGET_<triple>_RUNNER, so cargo nextest builds as root and every test process
# runs as this user). A unit test that needs root fails here with the kernel's EPERM or
# EACCES; nothing is skipped.
#
#   scripts/unprivileged.sh BINARY ARGS...
#
# The user is DRIVELET_TEST_USER (default drivelet-test; scripts/test.sh creates it).
set -euo pipefail
user=${DRIVELET_TEST_USER:-drivelet-test}
if [ "$(id -u)" != 0 ]; then
  # Not root already: nothing to drop.
  exec "$@"
fi
exec setpriv --reuid="$user" --regid="$user" --init-groups \
  --inh-caps=-all --ambient-caps=-all --bounding-set=-all --no-new-privs \
  env HOME=/nonexistent USER="$user" LOGNAME="$user" "$@"
