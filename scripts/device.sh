#!/usr/bin/env bash
# The one GPU script: build, then the phases named in PHASES (default: before tests quick doctor
# bench fused; the others on request), in the order below.
# Logs and JSON go to $OUT. Run it on a machine with a GPU and no internet from the repo root:
#   PHASES="tests graph" bash scripts/device.sh
# Phases:
#   before  host cost of the commit in .carry/old (a `git archive` of an older commit), for a
#           before/after comparison in one run; skipped when .carry/old is absent
#   tests   tests/gpu (the shared-GPU worker at P = 1..8, torch.compile) and the NCCL worker at P = 1
#   graph   the CUDA-graph suite alone (tests/gpu/test_graph_gpu.py), when `tests` is not run;
#           GRAPH_K selects with pytest -k (e.g. GRAPH_K="5 or 8")
#   quick   Wan 720p host cost and device time at QUICK_P (default 1 2 8; fast_ulysses.bench.quick_wan), then
#           the host time by stage (FAST_ULYSSES_HOST_PROFILE=1) at PROFILE_P (default 1 8), and P = 8
#           --staggered (each rank's host issue timed while the other ranks wait)
#   eager   the eager-graph cache (FAST_ULYSSES_EAGER_GRAPHS): the a2a worker's eager_graphs
#           check at every P (it builds groups with the switch on and off), then Wan 720p host cost
#           with the switch on and off, alternately (EAGER_RUNS, default "1 2": twice), at EAGER_P
#           (default 2 8), with the host time by stage
#   ab      Wan 720p host cost by stage at each size of AB_P (default "1 8") of the commit in
#           .carry/old and of this tree, alternately (old, new, old, new: AB_RUNS, default "1 2"),
#           both installed outside the tree
#   oldgraph  the graph checks captured_layer, eager_between_replays and
#           first_owned_call_after_capture at P = 2 against the commit in .carry/old: they must
#           fail there (built by `before`, or here)
#   node    the real-node suite, one rank per GPU (a kind with 2, 4 or 8 GPUs), at every size of
#           NODE_P (default "2 4 8") the machine has: the a2a worker over NCCL (its reference is
#           TorchUlyssesGroup over NCCL), the graph worker, fast-ulysses bench --graph with the
#           overlap rows and the NCCL baseline, and the USP row (bench --ring-degree RING_DEGREE,
#           default 2: ring x Ulysses against plain Ulysses, Wan 720p mode 0), and the FP8 wire row
#           (bench --wire NODE_WIRE, default fp8: the copy and borrowed calls with wire_dtype beside
#           the plain ones and their error, Wan 720p modes 0 and 1); logs and JSON packed into
#           node.tar.gz
#   probe   host time of single driver calls and of graph launches shaped like a P = 8 call,
#           without torch or peers (csrc/probes/launch_probe.cu): one process, then PROBE_N (default
#           8) processes at once on the GPU, as ranks sharing it are
#   doctor  fast-ulysses doctor (text and --json)
#   bench   fast-ulysses bench --graph --pipeline $PIPELINE (default 2: the pipelined-attention row)
#           at BENCH_SIZES (default "1 8"), packed into bench.tar.gz; BENCH_RING=auto (or R) adds
#           the USP row (--ring-degree: at P = 1 ring_attention against SDPA); BENCH_WIRE=fp8 (or
#           e4m3, e5m2) adds the FP8 wire row (--wire)
#   fused   the fused suite alone (tests/gpu/test_fused_gpu.py) unless `tests` ran or
#           FUSED_TESTS=0, then fast-ulysses bench --fused at P = 1 on Wan 720p and HunyuanVideo
#           720p; with .carry/old, the same bench of this tree and of the old commit, alternately
#           (new, old, new, old), both installed outside the tree; without it, FUSED_RUNS
#           (default 1) runs of this tree
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PHASES=${PHASES:-"before tests quick doctor bench fused"}  # eager, graph, oldgraph: on request
has() { [[ " $PHASES " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# Results are labelled with the GPU they ran on (h100, h200, ...), not a fixed name.
GPU_LABEL=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE '[a-z]+[0-9]{3}' \
  | head -1 | tr 'A-Z' 'a-z'); GPU_LABEL=${GPU_LABEL:-gpu}
# Build tools missing on an offline image travel as wheels in .whl (docs/DEVELOP.md).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
# The packages the adapters are tested against (tests/gpu/test_upstream_gpu.py), from .whl/upstream:
# yunchang and DeepSpeed (pinned in requirements/dev.txt) with what they need and the image lacks
# (everything but torch and numpy is there; pip keeps what is installed, or else takes every wheel
# as it is), and xfuser and fastvideo (.whl/upstream/nodeps) into build/upstream-nodeps, as .ci/run.
if [ -d .whl/upstream ]; then
  # (diffusers too, where its wheels travel in .whl/diffusers)
  diffusers_pin=$([ -d .whl/diffusers ] && grep -E '^diffusers==' requirements/dev.txt)
  { python3 -m pip install --no-index --find-links .whl/upstream \
      ${diffusers_pin:+--find-links .whl/diffusers} \
      $(grep -E '^(yunchang|deepspeed)==' requirements/dev.txt) $diffusers_pin \
    || python3 -m pip install --no-index --no-deps .whl/upstream/*.whl
    python3 -m pip install --no-index --find-links .whl/upstream/nodeps --no-deps --upgrade \
      --target build/upstream-nodeps -r requirements/upstream-nodeps.txt
  } > "$OUT/upstream_install.log" 2>&1 || tail -5 "$OUT/upstream_install.log"
  python3 -c "import glob, importlib.metadata as m, importlib.util as u
got = [f'{n} {m.version(n)}' if u.find_spec(n) else f'{n} MISSING' for n in ('yunchang', 'deepspeed', 'diffusers')]
print('upstream:', ', '.join(got), '| build/upstream-nodeps:', ' '.join(sorted(
    p.split('/')[-1][:-len('.dist-info')] for p in glob.glob('build/upstream-nodeps/*.dist-info'))))"
fi
# The system g++: a compiler wrapper that links libstdc++ statically into shared objects breaks
# the extension (docs/INSTALL.md, "Known build pitfall").
# Forced, not defaulted: an image may set CXX to such a wrapper, and CMake caches the compiler
# of an existing build tree, so the tree is rebuilt from scratch.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
# KEEP_BUILD=1 on a machine still warm from a call that built this tree: keep that build.
[ "${KEEP_BUILD:-0}" = 1 ] || rm -rf build/cp3*
export FAST_ULYSSES_CUDA_ARCH=${FAST_ULYSSES_CUDA_ARCH:-90}
# Warnings are errors in every build of ours (CMakeLists.txt), but the device's g++ may warn where
# the development machine's does not: here they are counted (build.log), never a lost GPU run.
NO_WERROR="-Ccmake.define.CMAKE_COMPILE_WARNING_AS_ERROR=OFF"
# quick_wan is this checkout's, whichever package it measures (`before` and `ab` put an older
# commit's on PYTHONPATH, which may have no fast_ulysses.bench.quick_wan): a copy in a folder of
# its own, run by path.
mkdir -p /tmp/fu-quick && cp python/fast_ulysses/bench/quick_wan.py /tmp/fu-quick/quick_wan.py
quick_one() {  # $1: label, $2: P, then quick_wan's own options; extra environment from the caller
  local label=$1 P=$2; shift 2
  FAST_ULYSSES_ALLOW_SHARED_GPU=1 timeout 120 python3 -m torch.distributed.run --standalone \
    --nproc-per-node $P /tmp/fu-quick/quick_wan.py --shared-gpu "$@" --json "$OUT/quick_${label}_p$P.json" \
    > "$OUT/quick_${label}_p$P.log" 2>&1
  echo "$label P=$P rc=$?"; grep -E "^Wan|call|stage" "$OUT/quick_${label}_p$P.log" | tail -7
}
quick() {  # $1: label; quick_wan at P = 1, 2, 8 ranks sharing the GPU
  for P in ${QUICK_P:-1 2 8}; do quick_one "$1" $P; done
}
build_old() {
  [ -d /tmp/old/fast_ulysses ] && return 0
  t0=$(date +%s)
  python3 -m pip install -q ./.carry/old --no-build-isolation --no-deps --target /tmp/old \
    > "$OUT/build_old.log" 2>&1 || { tail -20 "$OUT/build_old.log"; return 1; }
  echo "old build $(( $(date +%s) - t0 )) s"
}

install_new() {  # this tree outside the tree, in /tmp/new (the editable install's import hook
  # would win over PYTHONPATH, so it is removed)
  [ -d /tmp/new/fast_ulysses ] || python3 -m pip install -q . --no-build-isolation --no-deps \
    $NO_WERROR --target /tmp/new > "$OUT/build_new.log" 2>&1 || tail -20 "$OUT/build_new.log"
  python3 -m pip uninstall -y -q fast-ulysses > /dev/null 2>&1
}

if has before && [ -d .carry/old ]; then
  build_old && PYTHONPATH=/tmp/old:${PYTHONPATH:-} quick before
fi

t0=$(date +%s)
python3 -m pip install -v -e . --no-build-isolation --no-deps $NO_WERROR > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s, compiler warnings: $(grep -c 'warning:' "$OUT/build.log")"
python3 -c "import fast_ulysses as f, torch; print('import ok', f.__version__, 'torch', torch.__version__, '| cuda part:', f.cuda_load_error or 'loaded')"

if has node; then
  R=$OUT/node; mkdir -p "$R"; GPUS=$(nvidia-smi -L | wc -l)
  node_run() {  # $1: name, $2: P, then the command after torchrun's options
    local name=$1 P=$2; shift 2
    timeout ${NODE_TIMEOUT:-300} python3 -m torch.distributed.run --standalone \
      --nproc-per-node "$P" "$@" > "$R/${name}_p$P.log" 2>&1
    echo "node $name P=$P rc=$?"
  }
  for P in ${NODE_P:-2 4 8}; do
    if [ "$P" -gt "$GPUS" ]; then echo "node: P=$P skipped ($GPUS GPUs)"; continue; fi
    node_run a2a "$P" tests/workers/a2a_correctness.py --iterations ${NODE_ITERATIONS:-500}
    grep -E "passed|failed|FAILED" "$R/a2a_p$P.log" | tail -2
    node_run graph "$P" tests/workers/graph_correctness.py --replays 200
    grep -E "passed|failed|FAILED" "$R/graph_p$P.log" | tail -2
    node_run bench "$P" -m fast_ulysses.bench --graph --iters 50 --warmup 10 \
      --out-dir "$R" --label "${GPU_LABEL}-node-p$P"
    grep -v -i "warn" "$R/bench_p$P.log" | tail -${TAIL:-30}
    node_run usp "$P" -m fast_ulysses.bench --preset wan-720p --modes 0 --gemms 0 \
      --ring-degree ${RING_DEGREE:-2} --iters 10 --warmup 2 --no-plot \
      --out-dir "$R" --label "${GPU_LABEL}-node-p$P-usp"
    grep -i "attention\|usp\|results:" "$R/usp_p$P.log" | grep -v -i "warn" | tail -6
    node_run wire "$P" -m fast_ulysses.bench --preset wan-720p --gemms 0 --wire ${NODE_WIRE:-fp8} \
      --iters 20 --warmup 3 --no-plot --out-dir "$R" --label "${GPU_LABEL}-node-p$P-wire"
    grep -i "fast-ulysses copy\|fast-ulysses borrowed\|FP8 wire\|results:" "$R/wire_p$P.log" | tail -10
  done
  tar -czf "$OUT/node.tar.gz" -C "$OUT" node
fi
if has probe; then
  nvcc -O2 -arch=sm_90 -std=c++17 csrc/probes/launch_probe.cu -lcuda -o /tmp/launch_probe \
    > "$OUT/probe_build.log" 2>&1 || tail -5 "$OUT/probe_build.log"
  echo "launch probe, one process:"; timeout 120 /tmp/launch_probe | tee "$OUT/probe_1.txt"
  echo "launch probe, ${PROBE_N:-8} processes at once (each process's lines):"
  for i in $(seq ${PROBE_N:-8}); do timeout 240 /tmp/launch_probe --quiet > "$OUT/probe_n$i.txt" 2>&1 & done
  wait; cat "$OUT/probe_n1.txt"; echo "(process 8:)"; cat "$OUT/probe_n${PROBE_N:-8}.txt"
fi
if has tests; then
  timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    tests/workers/a2a_correctness.py --iterations 200 > "$OUT/nccl_p1.log" 2>&1
  echo "NCCL worker P=1 rc=$?"; tail -3 "$OUT/nccl_p1.log"
  timeout ${TESTS_TIMEOUT:-540} python3 -m pytest tests/gpu -v -rs -p no:cacheprovider \
    ${TESTS_K:+-k "$TESTS_K"} > "$OUT/gpu_pytest.log" 2>&1
  echo "pytest tests/gpu rc=$?"; grep -E "FAILED|ERROR|SKIPPED" "$OUT/gpu_pytest.log" | head -30
  grep -cE "PASSED" "$OUT/gpu_pytest.log"; tail -1 "$OUT/gpu_pytest.log"
elif has graph; then
  timeout ${GRAPH_TIMEOUT:-400} python3 -m pytest tests/gpu/test_graph_gpu.py -v -rs -p no:cacheprovider \
    ${GRAPH_K:+-k "$GRAPH_K"} > "$OUT/gpu_pytest.log" 2>&1
  echo "pytest graph rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_pytest.log" | tail -20
fi
if has quick; then
  quick after
  for P in ${PROFILE_P:-1 8}; do FAST_ULYSSES_HOST_PROFILE=1 quick_one profile $P; done
  # Each rank's issue timed alone (the others wait): what the ranks' concurrent issue costs.
  [ "${STAGGER:-1}" = 1 ] && quick_one staggered 8 --staggered
fi
if has eager; then
  # (-k selects the check, but the worker runs all of its checks: fewer back-to-back calls).
  # EAGER_K="" reports every check, all run with the cache on (the default; the eager_graphs
  # check sets the switch itself for its own groups).
  EAGER_K=${EAGER_K-eager_graphs}
  FAST_ULYSSES_GPU_ITERATIONS=${EAGER_ITERATIONS:-50} timeout ${EAGER_TIMEOUT:-300} python3 -m pytest tests/gpu/test_fast_group_gpu.py -v -rs \
    -p no:cacheprovider ${EAGER_K:+-k "$EAGER_K"} > "$OUT/eager_pytest.log" 2>&1
  echo "pytest eager rc=$?"; grep -E "FAILED|ERROR|eager_graphs" "$OUT/eager_pytest.log" | head -20
  tail -1 "$OUT/eager_pytest.log"
  for P in ${EAGER_P:-2 8}; do
    for run in ${EAGER_RUNS:-1 2}; do
      FAST_ULYSSES_HOST_PROFILE=1 FAST_ULYSSES_EAGER_GRAPHS=1 quick_one "graphs_on$run" $P
      FAST_ULYSSES_HOST_PROFILE=1 FAST_ULYSSES_EAGER_GRAPHS=0 quick_one "graphs_off$run" $P
    done
  done
fi
if has doctor; then
  python3 -m fast_ulysses.cli.doctor > "$OUT/doctor.txt" 2>&1; echo "doctor rc=$?"; tail -12 "$OUT/doctor.txt"
fi
if has bench; then
  R=$OUT/bench; mkdir -p "$R"
  for P in ${BENCH_SIZES:-1 8}; do
    FAST_ULYSSES_ALLOW_SHARED_GPU=1 timeout ${BENCH_TIMEOUT:-200} python3 -m torch.distributed.run \
      --standalone --nproc-per-node $P -m fast_ulysses.bench --shared-gpu --graph \
      --pipeline ${PIPELINE:-2} ${BENCH_RING:+--ring-degree $BENCH_RING} ${BENCH_WIRE:+--wire $BENCH_WIRE} --iters ${ITERS:-20} --warmup 3 --preset wan-720p --out-dir "$R" --label "${GPU_LABEL}-p$P-shared" \
      > "$R/bench_p$P.log" 2>&1
    echo "bench P=$P rc=$?"; grep -v -i "warn\|_check_peers" "$R/bench_p$P.log" | tail -${TAIL:-40}
  done
  tar -czf "$OUT/bench.tar.gz" -C "$OUT" bench
fi
fused_bench() {  # $1: label; the package on PYTHONPATH (or the editable install)
  # (through cli.main: an older commit's package has its bench in fast_ulysses.cli.bench)
  timeout 240 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    -m fast_ulysses.cli.main bench --fused --modes 0 --gemms 0 --iters 30 --warmup 5 \
    --preset wan-720p --preset hunyuan-720p --out-dir "$OUT/fused" --label "${GPU_LABEL}-p1-fused-$1" \
    > "$OUT/fused_$1.log" 2>&1
  echo "bench --fused $1 rc=$?"; grep -iE "fused|wan|hunyuan" "$OUT/fused_$1.log" | grep -v -i warn | tail -12
}
if has fused; then
  if ! has tests && [ "${FUSED_TESTS:-1}" = 1 ]; then
    timeout ${FUSED_TIMEOUT:-400} python3 -m pytest tests/gpu/test_fused_gpu.py -v -rs \
      -p no:cacheprovider > "$OUT/fused_pytest.log" 2>&1
    echo "pytest fused rc=$?"; grep -E "FAILED|ERROR" "$OUT/fused_pytest.log" | head -20
    tail -1 "$OUT/fused_pytest.log"
  fi
  if [ -d .carry/old ] && build_old; then
    # Both outside the tree: the editable install's import hook would win over PYTHONPATH.
    install_new
    for label in new1 old1 new2 old2; do
      PYTHONPATH=/tmp/${label%?}:${PYTHONPATH:-} fused_bench "$label"
    done
  else
    for run in $(seq ${FUSED_RUNS:-1}); do fused_bench "new$run"; done
  fi
fi
if has ab && [ -d .carry/old ] && build_old && install_new; then
  for P in ${AB_P:-1 8}; do
    for run in ${AB_RUNS:-1 2}; do
      for which in old new; do
        PYTHONPATH=/tmp/$which:${PYTHONPATH:-} FAST_ULYSSES_HOST_PROFILE=1 \
          quick_one "ab_${which}$run" $P
      done
    done
  done
fi
if has oldgraph && [ -d .carry/old ] && build_old; then
  # The worker is this checkout's; the package under test is the old one (the editable install's
  # import hook would win over PYTHONPATH, so it goes first).
  python3 -m pip uninstall -y -q fast-ulysses > /dev/null 2>&1
  PYTHONPATH=/tmp/old:${PYTHONPATH:-} python3 -c "import fast_ulysses as f; print('old package:', f.__file__)"
  FAST_ULYSSES_ALLOW_SHARED_GPU=1 FAST_ULYSSES_WATCHDOG_S=30 PYTHONPATH=/tmp/old:${PYTHONPATH:-} \
    timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    tests/workers/graph_correctness.py --shared-gpu --replays 50 \
    --only captured_layer,eager_between_replays,first_owned_call_after_capture \
    > "$OUT/oldgraph.log" 2>&1
  echo "old code, the captured layer and eager-between-replays graph checks at P=2: rc=$?" \
    "(must be non-zero)"
  grep -E "ok |FAILED|passed|failed|watchdog|Error" "$OUT/oldgraph.log" | head -12
fi
