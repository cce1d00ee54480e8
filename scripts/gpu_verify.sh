#!/usr/bin/env bash
# A short device check after a change: build, then the worker at P = 1, 2 and 8 ranks sharing
# the GPU (debug mode and watchdog checks included) and the torch.compile test.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export CXX=/usr/bin/g++ CC=/usr/bin/gcc
FAST_ULYSSES_CUDA_ARCH=90 python3 -m pip install -e . --no-build-isolation --no-deps > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
python3 -c "import fast_ulysses as f; print('import ok', f.cuda_load_error or 'cuda part loaded')"
T=tests/gpu/test_fast_group_gpu.py
timeout 250 python3 -m pytest -v -s -rs -p no:cacheprovider "$T::test_shared_gpu_correctness[1]" \
  "$T::test_shared_gpu_correctness[2]" "$T::test_shared_gpu_correctness[8]" "$T::test_compile_traces_the_op" > "$OUT/gpu_pytest.log" 2>&1; echo "pytest rc=$?"
grep -E "PASSED|FAILED|ERROR|passed|failed|^P=|  ok  |watchdog:" "$OUT/gpu_pytest.log" | cut -c1-400 | tail -40
