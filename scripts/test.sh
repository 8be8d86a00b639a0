#!/usr/bin/env bash
# Runs drivelet's tests (as root), one tier or all three. Prepares the host first
# (scripts/setup-host.sh: packages, udev, loop devices).
#
#   scripts/test.sh               all tiers: unit, integration, then end to end
#   scripts/test.sh unit          unit tests of the library (cargo test --lib), the
#                                 allocator test and the fuzz targets (tests/fuzz, 2 s
#                                 each), built as root and run as the unprivileged user
#                                 drivelet-test (created if missing): what a plain
#                                 `cargo test` runs, seconds once built
#   scripts/test.sh integration   the one integration binary (tests/integration, a module
#                                 per area): the real binary against loop devices, udev,
#                                 mkfs and mount, the deploy/ checks, the gRPC interop
#                                 clients and the community conformance suite
#   scripts/test.sh e2e           the end-to-end suite on the cluster kit (scripts/e2e.sh)
#
# More arguments after the tier go to cargo nextest (or cargo test), e.g. a filter:
# `scripts/test.sh integration volumes::health`.
# Built with the `failpoints` feature: tests/integration/robustness/crash.rs kills the agent at named crash
# points and fails without it.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=all
case "${1:-}" in
  unit | integration | e2e | all) tier=$1; shift ;;
esac
scripts/setup-host.sh

nextest() { cargo nextest --version >/dev/null 2>&1; }
test_user=${DRIVELET_TEST_USER:-drivelet-test}

# The unit tier: every test process runs as $test_user with no capabilities, through
# scripts/unprivileged.sh as cargo's target runner. A unit test that needs root fails.
unit() {
  if ! id -u "$test_user" >/dev/null 2>&1; then
    echo "creating the unprivileged test user $test_user"
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$test_user"
  fi
  if ! setpriv --reuid="$test_user" --regid="$test_user" --init-groups test -r Cargo.toml -a -x src; then
    echo "the unit tier runs as $test_user, who cannot read $PWD: every directory above it needs o+x (or set DRIVELET_TEST_USER)" >&2
    exit 1
  fi
  local triple runner
  triple=$(rustc -vV | sed -n 's/^host: //p')
  runner=CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUNNER
  if nextest; then
    # Build first (as root), so a target dir the user cannot read is named before any run.
    cargo nextest run --features failpoints --lib --test allocator --test fuzz --no-run
    target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    if ! setpriv --reuid="$test_user" --regid="$test_user" --init-groups test -x "$target/debug/deps"; then
      echo "the unit tier runs as $test_user, who cannot reach $target/debug/deps: make the target dir readable" >&2
      exit 1
    fi
    env "$runner=$PWD/scripts/unprivileged.sh" DRIVELET_TEST_USER="$test_user" \
      cargo nextest run --no-fail-fast --features failpoints --lib --test allocator --test fuzz "$@"
  else
    env "$runner=$PWD/scripts/unprivileged.sh" DRIVELET_TEST_USER="$test_user" \
      cargo test --no-fail-fast --features failpoints --lib --test allocator --test fuzz "$@"
  fi
}

# The integration tier: as root, against loop devices, udev, mkfs and mount.
integration() {
  if nextest; then cargo nextest run --no-fail-fast --features failpoints --test integration "$@"
  else cargo test --no-fail-fast --features failpoints --test integration "$@"; fi
}

case "$tier" in
  unit) unit "$@" ;;
  integration) integration "$@" ;;
  e2e) scripts/e2e.sh ;;
  all)
    status=0
    # The end-to-end suite's release build and image (scripts/image.sh: debootstrap)
    # are made beside the unit and integration tiers, at the lowest CPU priority: they
    # take the CPU and network time the tests leave idle (the integration tier mostly
    # waits on udev, mkfs and the kernel), which saves CI most of their 5 to 10 minutes.
    mkdir -p target
    build_log=target/e2e-build.log
    nice -n 19 bash -c 'cargo build --release --locked && SKIP_BUILD=1 scripts/image.sh target/image/drivelet.tar' >"$build_log" 2>&1 &
    build=$!
    unit "$@" || status=1
    integration "$@" || status=1
    if wait "$build"; then
      SKIP_BUILD=1 scripts/e2e.sh || status=1
    else
      echo "the release build or the image for the end-to-end suite failed ($build_log):" >&2
      tail -40 "$build_log" >&2
      status=1
    fi
    exit $status
    ;;
esac
