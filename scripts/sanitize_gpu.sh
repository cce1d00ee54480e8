#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck on the fast path's torchrun workers
# (tests/workers/a2a_correctness.py, the copy path; fused_correctness.py, the fused kernel)
# at P = 1 and 2 ranks sharing the first GPU over gloo. Needs a GPU, the package installed, and
# compute-sanitizer (CUDA toolkit).
#
#   bash scripts/sanitize_gpu.sh               # 8 runs: memcheck, racecheck x P = 1, 2 x workers
#   ITERATIONS=50 SIZES="2" TOOLS=memcheck WORKERS=a2a bash scripts/sanitize_gpu.sh
#
# Each rank runs under its own compute-sanitizer (torchrun --no-python), logging to
# $OUT_DIR/<worker>-<tool>-p<P>/sanitizer-<pid>.log beside the worker's run.log. One summary line
# per run: "sanitize: <worker> <tool> P=<P>: ok|FAILED (...)"; exits 1 if any run failed: a
# non-zero exit, a sanitizer error in any rank, a rank log without its summary, or no
# 'N passed, 0 failed' line.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT_DIR=${OUT_DIR:-build/sanitize-gpu}
ITERATIONS=${ITERATIONS:-20}
SIZES=${SIZES:-"1 2"}
TOOLS=${TOOLS:-"memcheck racecheck"}
WORKERS=${WORKERS:-"a2a fused"}  # a2a_correctness.py (--iterations ITERATIONS), fused_correctness.py
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-240}

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [[ ! -x $sanitizer ]]; then
  echo "sanitize: compute-sanitizer not found (PATH or /usr/local/cuda/bin)" >&2
  exit 2
fi
python=$(command -v python)
# A worker that cannot import the package exits before its first CUDA call, which the sanitizer
# reports only as "terminated before first instrumented API call": say so plainly instead.
if ! "$python" -c "import fast_ulysses" 2>/dev/null; then
  echo "sanitize: '$python' cannot import fast_ulysses: install the package first" >&2
  exit 2
fi

export FAST_ULYSSES_ALLOW_SHARED_GPU=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export FAST_ULYSSES_WATCHDOG_S=300  # sanitized calls are slow: report a hang, not slowness

# Sum of errors over a run's rank logs; prints "missing" if a log lacks its summary line.
sanitizer_errors() {
  local dir=$1 total=0 log n
  for log in "$dir"/sanitizer-*.log; do
    n=$(grep -hoE "ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazards displayed \([0-9]+ error" "$log" \
      | grep -oE "[0-9]+ error" | grep -oE "[0-9]+" | tail -1)
    if [[ -z $n ]]; then echo missing; return; fi
    total=$((total + n))
  done
  echo "$total"
}

failed=0
for worker in $WORKERS; do
  case $worker in
    a2a) script=(tests/workers/a2a_correctness.py --shared-gpu --iterations "$ITERATIONS") ;;
    # --only for memcheck; no torch.profiler (CUPTI) beside the sanitizer
    fused) script=(tests/workers/fused_correctness.py --shared-gpu --no-kernel-names) ;;
    *) echo "sanitize: WORKERS has '$worker': each must be a2a or fused" >&2; exit 2 ;;
  esac
  for tool in $TOOLS; do
    for P in $SIZES; do
      dir=$OUT_DIR/$worker-$tool-p$P
      rm -rf "$dir" && mkdir -p "$dir"
      extra_env=()
      # memcheck sees out-of-bounds accesses only without the caching allocator's slack. Without
      # it nothing can be allocated under CUDA-graph capture (cudaMalloc is not capturable), so
      # the fused worker's capture check (and torch.compile's, for time) run under racecheck only.
      only=()
      if [[ $tool == memcheck ]]; then
        extra_env=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
        [[ $worker == fused ]] && only=(--only matrix,qk_pair,eager_reuse,kernel_paths,refusals)
      fi
      start=$SECONDS
      env "${extra_env[@]}" timeout --kill-after=15 "$RUN_TIMEOUT_S" \
        torchrun --standalone --nproc-per-node "$P" --no-python \
        "$sanitizer" --tool "$tool" --error-exitcode 99 --log-file "$dir/sanitizer-%p.log" \
        "$python" "${script[@]}" "${only[@]}" >"$dir/run.log" 2>&1
      rc=$?
      logs=$(ls "$dir"/sanitizer-*.log 2>/dev/null | wc -l)
      errors=$(sanitizer_errors "$dir")
      [[ $logs -eq 0 ]] && errors=missing
      passed=$(grep -E "^[0-9]+ passed, 0 failed$" "$dir/run.log" | tail -1)
      if [[ $rc -eq 0 && $errors == 0 && $logs -eq $P && -n $passed ]]; then
        status=ok
      else
        status=FAILED
        failed=1
      fi
      echo "sanitize: $worker $tool P=$P: $status (exit $rc, sanitizer errors: $errors in $logs of" \
        "$P rank logs, worker: '${passed:-no summary}'), $((SECONDS - start)) s, logs in $dir"
      if [[ $status == FAILED ]]; then
        tail -n 30 "$dir/run.log" | sed 's/^/    /'
        grep -h -m 20 "=========" "$dir"/sanitizer-*.log 2>/dev/null | sed 's/^/    /'
      fi
    done
  done
done
exit $failed
