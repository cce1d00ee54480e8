"""The stage-by-stage benchmark behind `fast-ulysses bench` (docs/BENCHMARK.md)."""
