#!/usr/bin/env bash
# Runs drivelet's fuzz targets (tests/fuzz, one per parser of bytes drivelet did not
# write) for as long as asked; no root needed. CI runs each for 2 s in the unit tier.
#
#   scripts/fuzz.sh                 every target, 60 s each
#   scripts/fuzz.sh gpt 3600        one target (see docs/testing.md for the list) for an hour
#   scripts/fuzz.sh all 600         every target, 10 minutes each
#
# DRIVELET_FUZZ_SEED=N repeats a run's mutants (default: a new seed, printed);
# DRIVELET_FUZZ_REPLAY=FILE runs a saved failing input alone; FUZZ_RELEASE=1 builds
# optimised (with overflow checks kept), which runs more inputs a second but is a build
# of its own. A failure prints the input's file and how to run it again.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-all}
secs=${2:-60}
[ "$target" = all ] && target=
seed=${DRIVELET_FUZZ_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
profile=()
if [ "${FUZZ_RELEASE:-0}" = 1 ]; then
  profile=(--release)
  export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
fi
echo "fuzzing ${target:-every target} for ${secs} s each, seed $seed"
DRIVELET_FUZZ_SECS=$secs DRIVELET_FUZZ_SEED=$seed \
  cargo test "${profile[@]}" --features failpoints --test fuzz -- --nocapture --test-threads="${JOBS:-$(nproc)}" ${target:+--exact "$target"}
