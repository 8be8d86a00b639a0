#!/usr/bin/env bash
# Runs the whole test suite (as root): unit tests and the integration tests that drive
# the real binary against loop devices, udev, mkfs and mount. Prepares the host first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-host.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast "$@"
else
  cargo test --no-fail-fast "$@"
fi
