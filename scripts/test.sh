#!/usr/bin/env bash
# Runs drivelet's tests (as root), one tier or all three. Prepares the host first
# (scripts/setup-host.sh: packages, udev, loop devices).
#
#   scripts/test.sh               all tiers: unit, integration, then end to end
#   scripts/test.sh unit          unit tests of the library (cargo test --lib): seconds
#   scripts/test.sh integration   the real binary against loop devices, udev, mkfs and
#                                 mount, the deploy/ checks and the gRPC interop clients
#   scripts/test.sh e2e           the end-to-end suite on the cluster kit (scripts/e2e.sh)
#
# More arguments after the tier go to cargo nextest (or cargo test), e.g.
# `scripts/test.sh integration --test health`.
# Built with the `failpoints` feature: tests/crash.rs kills the agent at named crash
# points and fails without it.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=all
case "${1:-}" in
  unit | integration | e2e | all) tier=$1; shift ;;
esac
scripts/setup-host.sh

nextest() { cargo nextest --version >/dev/null 2>&1; }

case "$tier" in
  unit)
    if nextest; then cargo nextest run --no-fail-fast --features failpoints --lib "$@"
    else cargo test --no-fail-fast --features failpoints --lib "$@"; fi
    ;;
  integration)
    if nextest; then cargo nextest run --no-fail-fast --features failpoints -E 'not kind(lib)' "$@"
    else cargo test --no-fail-fast --features failpoints --test '*' "$@"; fi
    ;;
  e2e) scripts/e2e.sh ;;
  all)
    if nextest; then cargo nextest run --no-fail-fast --features failpoints "$@"
    else cargo test --no-fail-fast --features failpoints "$@"; fi
    scripts/e2e.sh
    ;;
esac
