#!/usr/bin/env bash
# Builds drivelet and runs it with the demo config (as root): three 2 GiB loop-backed
# drives under /tmp/drivelet-demo, created at start and removed at stop (Ctrl-C).
# In another terminal: target/release/drivelet ctl --config config/demo.toml drives
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-host.sh
cargo build --release
exec target/release/drivelet run --config config/demo.toml
