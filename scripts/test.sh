#!/usr/bin/env bash
# The tests this machine can run, in one of two tiers (docs/DEVELOP.md, "Test tiers"):
#
#   bash scripts/test.sh            # fast tier: C++ plan tests (ctest), 5,000 fuzzer inputs under
#                                   # ASan/UBSan, pytest -m "not full" (a few minutes on 2 cores)
#   FULL=1 bash scripts/test.sh     # full tier (CI, .ci/run): ctest, 100,000 sanitized fuzzer
#   bash scripts/test.sh --full     # inputs, every pytest test (every multi-rank worker)
#
# Arguments after the flag go to pytest (bash scripts/test.sh -k plan). FUZZ_INPUTS overrides the
# tier's fuzzer input count. GPU tests skip, saying why, where no GPU is visible; pytest's summary
# counts skipped tests apart from passed ones, and -rs lists each with its reason.
# Needs the package installed (README: pip install -e . --no-build-isolation) and cmake, ninja,
# a C++ compiler and the system GoogleTest: as root with apt-get it installs the missing ones,
# otherwise it stops with one line naming them.
set -euo pipefail
cd "$(dirname "$0")/.."

full=${FULL:-0}
if [ "${1:-}" = --full ]; then
  full=1
  shift
fi
case "$full" in
  0 | 1) ;;
  *)
    echo "scripts/test.sh: FULL is '$full': it must be 0 (fast tier) or 1 (full tier)" >&2
    exit 2
    ;;
esac
if [ "$full" = 1 ]; then
  tier=full fuzz_inputs=${FUZZ_INPUTS:-100000} pytest_select=()
else
  tier=fast fuzz_inputs=${FUZZ_INPUTS:-5000} pytest_select=(-m "not full")
fi

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v c++ >/dev/null || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ] || missing+=(libgtest-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "scripts/test.sh: installing ${missing[*]} (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "scripts/test.sh: missing ${missing[*]}; install them (apt-get install ${missing[*]}) and rerun" >&2
    exit 1
  fi
fi
if ! python -c "import fast_ulysses" 2>/dev/null; then
  echo "scripts/test.sh: \`python -c 'import fast_ulysses'\` fails; install the package first (pip install -e . --no-build-isolation) or run it to see why" >&2
  exit 1
fi

start=$SECONDS
stage_start=$SECONDS
finished=0
report() { # on any exit: the tier's time, and whether it passed
  local status=$? elapsed=$((SECONDS - start))
  local verdict="passed"
  [ "$status" = 0 ] && [ "$finished" = 1 ] || verdict="FAILED (exit $status)"
  echo "scripts/test.sh: $tier tier $verdict in $((elapsed / 60)) min $((elapsed % 60)) s"
}
trap report EXIT
took() { # took <what>: one line with the seconds since the previous stage ended
  echo "scripts/test.sh: $1 took $((SECONDS - stage_start)) s"
  stage_start=$SECONDS
}
echo "scripts/test.sh: $tier tier (ctest, $fuzz_inputs sanitized fuzzer inputs, pytest${pytest_select[*]:+ ${pytest_select[*]}})"

build=build/cpp-tests
cmake -S . -B "$build" -G Ninja -DFAST_ULYSSES_WITH_TORCH=OFF -DFAST_ULYSSES_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j 2
ctest --test-dir "$build" --output-on-failure -j 2
took "ctest (C++ plan tests)"
# The plan's fuzzer under ASan + UBSan (docs/DEVELOP.md: the full million is run by hand).
INPUTS=$fuzz_inputs bash scripts/fuzz.sh
took "fuzz ($fuzz_inputs inputs, ASan + UBSan)"

# pytest exits 5 when it collects nothing: that is a failure here, not a pass (set -e).
python -m pytest -q -rs "${pytest_select[@]}" "$@"
took "pytest${pytest_select[*]:+ ${pytest_select[*]}}"
finished=1
