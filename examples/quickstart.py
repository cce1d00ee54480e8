"""fast-ulysses quick start: one Ulysses layer's all-to-alls, checked.

    python examples/quickstart.py [--nproc P]

With GPUs: one rank per GPU (up to 8) over NCCL; make_group picks the fast path (UlyssesGroup)
where the GPUs allow it and says why not otherwise.
Without a GPU: 4 CPU ranks over gloo; make_group falls back to TorchUlyssesGroup (and says
why), so the same code runs a real all-to-all on the CPU. Under torchrun it runs on the ranks
torchrun launched.
Either way every result is compared bit-exactly with fast_ulysses.simulate, the CPU execution
of the copy plan the fast path issues, and the plan of Wan 2.1 720p on 8 ranks is printed.
"""

from __future__ import annotations

import sys

import _launch  # how every example starts its ranks (examples/_launch.py)
import torch
import torch.distributed as dist

import fast_ulysses as fu
from fast_ulysses.presets import even_splits

# A small uneven case: 12 heads on the ranks (Wan 1.3B-like), sequence rows not divisible.
HEADS, HEAD_DIM, BATCH = 12, 64, 1
CPU_RANKS = 4  # without a GPU


def splits(world_size: int) -> tuple[list[int], list[int]]:
    seq = [37 + 3 * r for r in range(world_size)]
    return seq, even_splits(HEADS, world_size)


def quickstart(rank: int, world_size: int, device: torch.device, args) -> bool:
    group = fu.make_group(initial_pool_bytes=64 << 20)
    seq, heads = splits(world_size)
    inputs = [
        torch.randn(BATCH, seq[r], HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(r)).to(
            torch.bfloat16
        )
        for r in range(world_size)
    ]
    x = inputs[rank].to(device)
    # Before attention: sequence-sharded -> head-sharded. After: back.
    y = group.all_to_all_single_4d(x, 0, "q", seq_splits=seq, head_splits=heads)
    z = group.all_to_all_single_4d(y, 1, "out", seq_splits=seq, head_splits=heads)
    want = fu.simulate(inputs, 0, seq_splits=seq, head_splits=heads)[rank]
    ok = torch.equal(y.cpu(), want) and torch.equal(z.cpu(), inputs[rank])
    summary = torch.tensor([int(ok)], device=device)
    dist.all_reduce(summary, op=dist.ReduceOp.MIN)
    if rank == 0:
        kind = (
            "fast path (UlyssesGroup)"
            if not group.fallback
            else f"torch.distributed fallback (TorchUlyssesGroup): {group.fallback_reason}"
        )
        print(f"{world_size} ranks on {'GPUs' if device.type == 'cuda' else 'CPU'}, {kind}")
        print(
            f"mode 0: {tuple(x.shape)} -> {tuple(y.shape)} on rank 0 (seq_splits {seq}, "
            f"head_splits {heads}); mode 1 back to {tuple(z.shape)}"
        )
        print(
            f"every rank's result equals fast_ulysses.simulate bit for bit: {bool(summary.item())}"
        )
        print_wan_plan()
    group.destroy()
    if not ok:
        print(f"rank {rank}: result differs from simulate", file=sys.stderr)
    return ok


def print_wan_plan() -> None:
    """The plan of Wan 2.1 720p on 8 ranks (GPU-free: fast_ulysses.plan)."""
    p = fu.plan(8, 0, 0, (1, 9450, 40, 128), torch.bfloat16)
    print(
        f"Wan 2.1 720p on 8 ranks, rank 0, mode 0: {p.input_shape} -> {p.output_shape}; "
        f"{len(p)} pitched copies of {p[1].bytes:,} bytes (width {p[1].width} B, "
        f"src pitch {p[1].src_pitch} B); window {p.window_bytes:,} bytes "
        "(see `fast-ulysses plan --preset wan-720p --world-size 8`)"
    )


if __name__ == "__main__":
    parser = _launch.parser(__doc__, cpu_ranks=CPU_RANKS)
    args = parser.parse_args()  # every argument checked before any rank starts
    world = _launch.world_size(parser, args, cpu_ranks=CPU_RANKS)
    sys.exit(_launch.launch(quickstart, args, world))
