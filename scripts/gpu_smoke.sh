#!/usr/bin/env bash
# Quick device check: build for sm90, import, the shared-GPU worker at a few sizes.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export FAST_ULYSSES_ALLOW_SHARED_GPU=1 FAST_ULYSSES_WATCHDOG_S=30
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L
# Build tools the device image lacks travel as wheels in .whl (docs/DEVELOP.md).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -c "import scikit_build_core, sys; print('scikit-build-core', scikit_build_core.__version__, sys.executable)"
t0=$(date +%s)
# The image's default /opt/gcc wrapper links libstdc++ statically into shared objects: its second,
# uninitialised copy of the iostream locale crashes on first use. The system g++ links it shared.
export CXX=/usr/bin/g++ CC=/usr/bin/gcc
rm -rf build/cp312-*
FAST_ULYSSES_CUDA_ARCH=90 python3 -m pip install -e . --no-build-isolation --no-deps > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
python3 -c "import fast_ulysses as f; print('import ok', f.__version__, f.cuda_load_error or 'cuda part loaded')"
for P in ${SMOKE_SIZES:-1 2 4}; do
  timeout 240 python3 -m torch.distributed.run --standalone --nproc-per-node $P \
    tests/distributed/a2a_correctness.py --shared-gpu --iterations ${ITERS:-100} > "$OUT/worker_p$P.log" 2>&1
  echo "P=$P rc=$?"; tail -${TAIL:-12} "$OUT/worker_p$P.log"
done
