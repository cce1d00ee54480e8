#!/usr/bin/env bash
# Every test this machine can run: the C++ plan tests (GoogleTest via ctest), then pytest
# (CPU tests on gloo; GPU tests skip, saying why, where no GPU is visible).
# Needs the package installed (README: pip install -e . --no-build-isolation) and cmake, ninja,
# a C++ compiler and the system GoogleTest: as root with apt-get it installs the missing ones,
# otherwise it stops with one line naming them.
set -euo pipefail
cd "$(dirname "$0")/.."

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

build=build/cpp-tests
cmake -S . -B "$build" -G Ninja -DFAST_ULYSSES_WITH_TORCH=OFF -DFAST_ULYSSES_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j 2
ctest --test-dir "$build" --output-on-failure -j 2
# The plan's fuzzer under ASan + UBSan (docs/DEVELOP.md: the full million is run by hand).
INPUTS=${FUZZ_INPUTS:-100000} bash scripts/fuzz.sh

# pytest exits 5 when it collects nothing: that is a failure here, not a pass.
python -m pytest -q -rs "$@"
