"""Ulysses x Ring (USP): one attention over ring R x Ulysses U ranks, checked against one process.

    python examples/usp_attention.py [--nproc P] [--ulysses-degree U]

`fu.usp_mesh(U)` lays the P ranks out as R = P / U Ulysses groups of U consecutive ranks (one
node's ranks, when U is the ranks per node) and U rings across them; `fu.make_group(mesh)` builds
the Ulysses group (the fast path where the GPUs allow it) and sets `group.ring_group`, and
`fu.UlyssesAttention(group)` runs the Ulysses all-to-alls on the group and ring attention over
the ring. 10 heads (uneven when U does not divide 10), world rank r holding sequence block r.
Without GPUs: 4 CPU ranks over gloo, U = 2 (2 x 2). Past one node, the same code under
`torchrun --nnodes N` (docs/MULTINODE.md).
"""

import sys

import _launch  # how every example starts its ranks (examples/_launch.py)
import torch
import torch.nn.functional as F

import fast_ulysses as fu

HEADS, ROWS, D = 10, 32, 64  # heads, sequence rows per rank, head dim


def attention(rank: int, P: int, device: torch.device, args) -> bool:
    U = args.ulysses_degree or (P // 2 if P % 2 == 0 else P)
    group = fu.make_group(fu.usp_mesh(U))  # collective: every rank of the world
    R = P // U
    if rank == 0:
        print(f"{P} ranks: ring {R} x Ulysses {U}, fallback={group.fallback}")

    # The whole sequence, the same on every rank (seeded): world rank r holds rows block r.
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(1, P * ROWS, HEADS, D, generator=g).to(device, dtype) for _ in "qkv")
    mine = [t[:, rank * ROWS : (rank + 1) * ROWS].clone().requires_grad_() for t in (q, k, v)]
    heads = [HEADS // U + (i < HEADS % U) for i in range(U)]  # uneven where U does not divide

    out = fu.UlyssesAttention(group)(*mine, head_splits=heads)  # (1, ROWS, HEADS, D)
    out.float().square().sum().backward()

    # One process over the whole sequence and every head, and this rank's rows of it.
    whole = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in whole)).transpose(1, 2)
    want.square().sum().backward()
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    pairs = [(out.detach(), want[:, rows].detach())]
    pairs += [(t.grad, w.grad[:, rows]) for t, w in zip(mine, whole)]
    # Each difference relative to the reference's largest value (bf16 rounds at ~1e-2).
    errors = [((a.float() - b).abs().max() / b.abs().max()).item() for a, b in pairs]
    tolerance = 3e-2 if dtype == torch.bfloat16 else 1e-5
    ok = max(errors) <= tolerance
    names = ("out", "dq", "dk", "dv")
    print(
        f"rank {rank}: Ulysses rank {group.rank}, ring rank {rank // U}: largest difference from "
        f"one process, relative: {', '.join(f'{n} {e:.1e}' for n, e in zip(names, errors))} "
        f"(tolerance {tolerance:g}): {'ok' if ok else 'MISMATCH'}"
    )
    group.destroy()
    return ok


if __name__ == "__main__":
    parser = _launch.parser(__doc__, cpu_ranks=4)
    parser.add_argument(
        "--ulysses-degree",
        type=_launch.count(2),
        default=None,
        help="ranks per Ulysses group, dividing the rank count (default: half of it where it is "
        "even, else all of it: no ring)",
    )
    args = parser.parse_args()  # every argument checked before any rank starts
    P = _launch.world_size(parser, args, cpu_ranks=4)
    if args.ulysses_degree is not None and P % args.ulysses_degree:
        parser.error(
            f"--ulysses-degree is {args.ulysses_degree}: it must divide the {P} ranks "
            f"(ring degree x Ulysses degree = ranks; e.g. --ulysses-degree {P // 2 or 1})"
        )
    sys.exit(_launch.launch(attention, args, P))
