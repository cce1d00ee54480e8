"""One Ulysses attention layer on fast-ulysses.

    python examples/ulysses_layer.py [--nproc P]

12 heads on P ranks (uneven when P does not divide 12). With GPUs, one rank per GPU over NCCL and
the fast path where the GPUs allow it; without, 4 CPU ranks over gloo and the torch.distributed
fallback (make_group says why). Under torchrun it runs on the ranks torchrun launched.
"""

import sys

import _launch  # how every example starts its ranks (examples/_launch.py)
import torch
import torch.nn.functional as F

import fast_ulysses as fu
from fast_ulysses.presets import even_splits


def layer(rank: int, P: int, device: torch.device, args) -> None:
    group = fu.make_group(initial_pool_bytes=1 << 30 if device.type == "cuda" else 0)
    if rank == 0:
        print(f"{P} ranks, fallback={group.fallback} {group.fallback_reason}")

    heads = even_splits(12, P)  # e.g. [2, 2, 2, 2, 1, 1, 1, 1] on 8 ranks
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 256, 12, 64, generator=g).to(device, torch.bfloat16) for _ in "qkv")

    # Sequence-sharded (b, s_local, 12, d) -> head-sharded (b, S, heads[rank], d).
    q, k, v = (
        group.all_to_all_single_4d(t, 0, tag, head_splits=heads) for t, tag in zip((q, k, v), "qkv")
    )
    o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    out = group.all_to_all_single_4d(
        o.contiguous(), 1, "o", head_splits=heads
    )  # back to (b, s_local, 12, d)
    print(f"rank {rank}: q {tuple(q.shape)} -> attention -> out {tuple(out.shape)}")
    group.destroy()


if __name__ == "__main__":
    parser = _launch.parser(__doc__, cpu_ranks=4)
    args = parser.parse_args()  # every argument checked before any rank starts
    sys.exit(_launch.launch(layer, args, _launch.world_size(parser, args, cpu_ranks=4)))
