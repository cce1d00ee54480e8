#!/usr/bin/env bash
# The plan's fuzz test under AddressSanitizer + UndefinedBehaviorSanitizer: builds
# tests/cpp/fuzz_plan.cpp with -DFAST_ULYSSES_SANITIZE=ON in its own tree (build/fuzz, no torch,
# no CUDA) and runs it. Any sanitizer report aborts the run (exit non-zero); a failing input is
# printed in full with the command that replays it.
#
#   bash scripts/fuzz.sh                  # 1,000,000 inputs, the fixed default seed
#   INPUTS=100000 bash scripts/fuzz.sh    # fewer (what CI runs)
#   SEED=$RANDOM bash scripts/fuzz.sh     # another seed (printed, so a failure replays)
set -euo pipefail
cd "$(dirname "$0")/.."

build=build/fuzz
cmake -S . -B "$build" -G Ninja -DFAST_ULYSSES_WITH_TORCH=OFF -DFAST_ULYSSES_BUILD_TESTS=ON \
  -DFAST_ULYSSES_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j 2 --target fu_plan_fuzz
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
"$build/tests/cpp/fu_plan_fuzz" --inputs "${INPUTS:-1000000}" ${SEED:+--seed "$SEED"}
