#!/usr/bin/env bash
# Runs the whole test suite (as root): unit tests and the integration tests that drive
# the real binary against loop devices, udev, mkfs and mount. Prepares the host first.
# Built with the `failpoints` feature: tests/crash.rs kills the agent at named crash
# points and fails without it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-host.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast --features failpoints "$@"
else
  cargo test --no-fail-fast --features failpoints "$@"
fi
