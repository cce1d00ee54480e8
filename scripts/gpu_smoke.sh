#!/usr/bin/env bash
# Quick device check: build for sm90, import, the shared-GPU worker at a few sizes.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export FAST_ULYSSES_ALLOW_SHARED_GPU=1 FAST_ULYSSES_WATCHDOG_S=30
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L
t0=$(date +%s)
FAST_ULYSSES_CUDA_ARCH=90 pip install -e . --no-build-isolation --no-deps > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
python -c "import fast_ulysses as f; print('import ok', f.__version__, f.cuda_load_error or 'cuda part loaded')"
for P in ${SMOKE_SIZES:-1 2 4}; do
  timeout 240 python -m torch.distributed.run --standalone --nproc-per-node $P \
    tests/distributed/a2a_correctness.py --shared-gpu --iterations ${ITERS:-100} > "$OUT/worker_p$P.log" 2>&1
  echo "P=$P rc=$?"; tail -${TAIL:-12} "$OUT/worker_p$P.log"
done
