"""Every benchmark of fast-ulysses, one module each (docs/BENCHMARK.md says how to run them):

- `command` (with `stages`, `timing`, `report`, `attention`): `fast-ulysses bench`, also
  `python -m fast_ulysses.bench` (under torchrun too): the stage-by-stage benchmark on real
  model shapes against the NCCL baseline;
- `quick_wan`: `torchrun ... -m fast_ulysses.bench.quick_wan`: Wan 720p host cost and device
  time per call;
- `micro_copy`: `python -m fast_ulysses.bench.micro_copy`: pitched-copy and issue-cost
  micro-benchmarks (one GPU; the `micro` extra, cuda-bindings);
- `fallback_check_cost`: `python -m fast_ulysses.bench.fallback_check_cost`: the fallback's
  call check on 2 gloo CPU ranks (no GPU).

Recorded results are data, not code: benchmarks/results/ in the source tree (not installed).
"""
