#!/usr/bin/env bash
# Benchmarks on the one-GPU device: fast-ulysses bench at P = 1, 2, 4, 8 ranks sharing the GPU,
# the micro-benchmarks; everything packed into $OUT/bench.tar.gz (the device returns 8 files).
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=$OUT/bench; mkdir -p "$R"
export FAST_ULYSSES_ALLOW_SHARED_GPU=1
for P in ${BENCH_SIZES:-1 2 4 8}; do
  echo "\$ torchrun --nproc-per-node $P -m fast_ulysses.cli.bench --shared-gpu --iters ${ITERS:-20} --warmup 3 --gemm-size 4096"
  timeout ${BENCH_TIMEOUT:-170} python3 -m torch.distributed.run --standalone --nproc-per-node $P \
    -m fast_ulysses.cli.bench --shared-gpu --iters ${ITERS:-20} --warmup 3 --gemm-size 4096 \
    --out-dir "$R" --label "h200-p$P-shared" > "$R/bench_p$P.log" 2>&1
  echo "rc=$?"; grep -v -i "warn\|_check_peers" "$R/bench_p$P.log" | tail -${TAIL:-60}
done
echo '$ python benchmarks/micro_copy.py'
timeout 60 python3 benchmarks/micro_copy.py --json "$R/micro_copy-h200.json" > "$R/micro.log" 2>&1; echo "rc=$?"; tail -25 "$R/micro.log"
tar -czf "$OUT/bench.tar.gz" -C "$OUT" bench
