#!/usr/bin/env bash
# The one scripted device call: build, every GPU test, doctor, the quick Wan measurement, and
# (PHASE=all or bench) the benchmarks. Logs and JSON go to $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PHASE=${PHASE:-all}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
# The system g++, not the image's /opt/gcc wrapper (docs/INSTALL.md, "Known build pitfall").
export CXX=/usr/bin/g++ CC=/usr/bin/gcc
t0=$(date +%s)
echo '$ FAST_ULYSSES_CUDA_ARCH=90 pip install -e . --no-build-isolation'
FAST_ULYSSES_CUDA_ARCH=90 python3 -m pip install -e . --no-build-isolation --no-deps > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
tail -1 "$OUT/build.log"; echo "build $(( $(date +%s) - t0 )) s"
echo '$ python -c "import fast_ulysses"'
python3 -c "import fast_ulysses as f, torch; print('import ok', f.__version__, 'torch', torch.__version__, '| cuda part:', f.cuda_load_error or 'loaded')"

if [ "$PHASE" = all ] || [ "$PHASE" = tests ]; then
  python3 -m fast_ulysses.cli.doctor > "$OUT/doctor.txt" 2>&1; echo "doctor rc=$?"; tail -45 "$OUT/doctor.txt"
  python3 -m fast_ulysses.cli.doctor --json > "$OUT/doctor.json" 2>"$OUT/doctor_json.err"; echo "doctor --json rc=$?"
  echo '$ torchrun --nproc-per-node 1 tests/distributed/a2a_correctness.py   (NCCL, reference TorchUlyssesGroup)'
  timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    tests/distributed/a2a_correctness.py --iterations 200 > "$OUT/nccl_p1.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/nccl_p1.log"
  echo '$ python -m pytest tests/gpu -v'
  timeout 420 python3 -m pytest tests/gpu -v -s -rs -p no:cacheprovider > "$OUT/gpu_pytest.log" 2>&1; echo "rc=$?"
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|^P=" "$OUT/gpu_pytest.log" | tail -24
  FAST_ULYSSES_ALLOW_SHARED_GPU=1 timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 8 \
    benchmarks/quick_wan.py --shared-gpu --json "$OUT/quick_wan_p8.json" > "$OUT/quick_wan.log" 2>&1; echo "quick_wan rc=$?"; grep -v Warning "$OUT/quick_wan.log" | tail -4
fi
if [ "$PHASE" = all ] || [ "$PHASE" = bench ]; then
  bash benchmarks/run_device_bench.sh
fi
