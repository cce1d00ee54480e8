#!/usr/bin/env bash
# What `pip install fast-ulysses` users get, checked from outside the source tree:
#   1. a wheel built from this tree and an sdist, then a wheel built from that sdist; both
#      wheels hold both extension modules, _build_info.py, LICENSE and the benchmarks
#      (fast_ulysses/bench/, no recorded results), and the same files
#      (the same bytes, compiled libraries aside); the sdist holds LICENSE;
#   2. the sdist's wheel installed into a fresh virtual environment;
#   3. from a scratch folder holding only copies of tests/, examples/ and README.md:
#      `import fast_ulysses` must resolve to that environment (asserted), then
#      `fast-ulysses --version`, `plan`, `doctor`, and pytest on tests/python (plus tests/gpu
#      with --gpu).
#
# usage: bash scripts/check_wheel.sh [--system-site-packages] [--gpu | --gpu-only] [-- PYTEST_ARGS...]
#   --system-site-packages  the environment reuses this Python's torch and test tools and
#                           installs offline (a machine without internet); without it, torch
#                           comes from requirements/torch.txt and the rest from the index.
#   --gpu                   also run tests/gpu against the installed wheel.
#   --gpu-only              run tests/gpu and not tests/python (a GPU machine, after the CPU
#                           suite has passed elsewhere).
# Environment: PYTHON (default python), CHECK_WHEEL_DIR (where the sdist, wheels, environment
# and test copies go, kept at the end; default a new temporary folder, removed after a pass and
# kept after a failure), and whatever the build reads (CC, CXX, FAST_ULYSSES_CUDA_ARCH).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-python}"
system_site=0
suites=(tests/python)
while [ $# -gt 0 ]; do
  case "$1" in
    --system-site-packages) system_site=1 ;;
    --gpu) suites+=(tests/gpu) ;;
    --gpu-only) suites=(tests/gpu) ;;
    --) shift; break ;;
    *) echo "check_wheel.sh: unknown argument $1 (see the header for usage)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$system_site" = 1 ] && "$py" -c "import importlib.metadata as m; m.distribution('fast-ulysses')" 2>/dev/null; then
  echo "check_wheel.sh: $py already has fast-ulysses installed; with --system-site-packages the" \
    "environment would import that copy, not the wheel: pip uninstall fast-ulysses first" >&2
  exit 1
fi

work="${CHECK_WHEEL_DIR:-$(mktemp -d /tmp/fast-ulysses-wheel.XXXXXX)}"
mkdir -p "$work"
trap 'echo "check_wheel.sh: failed; its files are in $work" >&2' ERR
step() { echo "== check_wheel: $* ($(date +%T))"; }

step "wheel from the tree"
"$py" -m pip wheel "$repo" --no-build-isolation --no-deps -q -w "$work/tree" \
  -C build-dir="$work/build-tree"
step "sdist"
(cd "$repo" && "$py" -c "import sys; from scikit_build_core.build import build_sdist; \
print(build_sdist(sys.argv[1]))" "$work/sdist")
sdist=$(ls "$work"/sdist/fast_ulysses-*.tar.gz)
step "wheel from the sdist"
"$py" -m pip wheel "$sdist" --no-build-isolation --no-deps -q -w "$work/wheel"
wheel=$(ls "$work"/wheel/fast_ulysses-*.whl)

step "contents"
"$py" - "$sdist" "$wheel" "$(ls "$work"/tree/fast_ulysses-*.whl)" <<'EOF'
import sys, tarfile, zipfile

sdist, wheel, tree = sys.argv[1:]
names = tarfile.open(sdist).getnames()
assert any(n.count("/") == 1 and n.endswith("/LICENSE") for n in names), f"{sdist}: no LICENSE"


def contents(path):
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist() if not n.endswith("RECORD")}


a, b = contents(wheel), contents(tree)
for name in ("fast_ulysses/_build_info.py", "fast_ulysses/_version.py"):
    assert name in a, f"{wheel}: no {name}"
for module in ("fast_ulysses/_C.", "fast_ulysses/_cuda."):
    assert any(n.startswith(module) and n.endswith(".so") for n in a), f"{wheel}: no {module}*.so"
assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
           for n in a), f"{wheel}: no LICENSE in its .dist-info"
for name in ("command", "quick_wan", "micro_copy", "fallback_check_cost"):
    assert f"fast_ulysses/bench/{name}.py" in a, f"{wheel}: no fast_ulysses/bench/{name}.py"
records = [n for n in a if n.endswith((".json", ".png")) or "benchmarks/" in n]
assert not records, f"{wheel}: ships recorded results {records[:3]}"
assert a.keys() == b.keys(), f"the sdist's wheel and the tree's differ in files: {a.keys() ^ b.keys()}"
differ = [n for n in a if not n.endswith(".so") and a[n] != b[n]]
assert not differ, f"the sdist's wheel and the tree's differ in {differ}"
print(f"ok: {len(a)} files, the same in both wheels; LICENSE in the sdist and the wheel")
EOF

step "fresh virtual environment"
venv="$work/venv"
rm -rf "$venv"
if [ "$system_site" = 1 ]; then
  "$py" -m venv --system-site-packages "$venv"
  # When $py is itself a virtual environment, --system-site-packages reaches only the base
  # interpreter's packages: a .pth file puts $py's own site folders on the new one's path.
  "$py" -c "import site; print('\n'.join(site.getsitepackages()))" \
    > "$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_outer_site.pth"
  # Offline: the dependencies are whatever $py has; pip check lists any that are missing.
  "$venv/bin/python" -m pip install -q --no-index --no-deps "$wheel"
  "$venv/bin/python" -m pip check || echo "check_wheel.sh: pip check found the gaps above (offline, not installed)"
else
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q -r "$repo/requirements/torch.txt"
  "$venv/bin/python" -m pip install -q "$wheel[test,plot]"
fi

step "tests from outside the source tree"
run="$work/run"
rm -rf "$run" && mkdir -p "$run/tests"
cp -r "$repo/tests/python" "$repo/tests/gpu" "$repo/tests/workers" "$repo"/tests/*.py "$run/tests/"
cp -r "$repo/examples" "$repo/README.md" "$run/"  # README: the quick-start test compares it with examples/
printf '[pytest]\ntimeout = 600\n' > "$run/pytest.ini"
cd "$run"
export PATH="$venv/bin:$PATH"
"$venv/bin/python" - "$venv" "$repo" <<'EOF'
import os, sys
import fast_ulysses, fast_ulysses._C, fast_ulysses._build_info

venv, repo = (os.path.realpath(p) for p in sys.argv[1:])
site = [p for p in sys.path if os.path.realpath(p).startswith(venv) and p.endswith("site-packages")]
for module in (fast_ulysses, fast_ulysses._C, fast_ulysses._build_info):
    where = os.path.realpath(module.__file__)
    assert site and where.startswith(os.path.realpath(site[0]) + os.sep), (
        f"{module.__name__} comes from {where}, not from the wheel installed in {venv}: an "
        f"editable install of fast-ulysses is visible here; uninstall it from this Python first")
    assert not where.startswith(repo + os.sep), f"{module.__name__} comes from the checkout {where}"
print(f"ok: fast_ulysses {fast_ulysses.__version__} from {os.path.dirname(fast_ulysses.__file__)}")
EOF
[ "$(command -v fast-ulysses)" = "$venv/bin/fast-ulysses" ]
fast-ulysses --version
fast-ulysses plan --preset wan-720p --world-size 8 >/dev/null
fast-ulysses doctor --no-symm-init >/dev/null
echo "ok: fast-ulysses --version, plan, doctor"
python -m pytest -q -rs -p no:cacheprovider "${suites[@]}" "$@"
if [ -n "${CHECK_WHEEL_DIR:-}" ]; then
  step "passed; everything is in $work"
else
  rm -rf "$work"
  step "passed"
fi
