"""A Wan 2.1 attention block with the fused QK RMSNorm + RoPE scatter, against one process.

Each rank holds its rows of the sequence. q and k go through `qk_norm_rope_all_to_all_qk`
(RMSNorm over all heads, interleaved RoPE, then the mode-0 all-to-all, one closing handshake for
both), v through the plain borrowed all-to-all, then SDPA on this rank's heads and the mode-1
all-to-all of the output back to its rows. The result is compared with the same block computed
unsharded in one process.

With GPUs: one rank per GPU (up to 8) over NCCL, UlyssesGroup where make_group picks it (the
fused kernel). Without a GPU: 3 CPU ranks over gloo, TorchUlyssesGroup (the same math unfused).
Under torchrun it runs on the ranks torchrun launched.
12 heads and a sequence the rank count does not divide: uneven splits throughout.

    python examples/wan_fused_attention.py [--nproc P]
"""

from __future__ import annotations

import sys

import _launch  # how every example starts its ranks (examples/_launch.py)
import torch
import torch.distributed as dist
import torch.nn.functional as F

import fast_ulysses as fu
from fast_ulysses.fused import norm_rope_reference
from fast_ulysses.presets import even_splits

HEADS, HEAD_DIM, BATCH, SEQ, EPS = 12, 64, 1, 101, 1e-6
CPU_RANKS = 3  # without a GPU


def block_inputs(dtype):
    """q, k, v (b, S, N, d), the norm weights and the RoPE angles, the same on every rank."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=g).to(dtype) for _ in range(3))
    wq, wk = (torch.rand(HEADS * HEAD_DIM, generator=g) + 0.5 for _ in range(2))
    angle = torch.arange(SEQ)[:, None] * 10000.0 ** (-torch.arange(HEAD_DIM // 2) / (HEAD_DIM // 2))
    return q, k, v, wq, wk, angle.float()


def attention(q, k, v):
    """SDPA on (b, s, h, d) tensors."""
    return (
        F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        .transpose(1, 2)
        .contiguous()
    )


def one_process(dtype):
    q, k, v, wq, wk, angle = block_inputs(dtype)
    rope = dict(eps=EPS, cos=angle.cos(), sin=angle.sin())
    return attention(norm_rope_reference(q, wq, **rope), norm_rope_reference(k, wk, **rope), v)


def block(rank: int, world_size: int, device: torch.device, args) -> bool:
    use_gpu = device.type == "cuda"
    dtype = torch.bfloat16 if use_gpu else torch.float32
    group = fu.make_group(dist.group.WORLD, initial_pool_bytes=64 << 20)
    seq = even_splits(SEQ, world_size)
    heads = even_splits(HEADS, world_size)
    rows = slice(sum(seq[:rank]), sum(seq[: rank + 1]))
    q, k, v, wq, wk, angle = block_inputs(dtype)
    local = [t[:, rows].contiguous().to(device) for t in (q, k, v)]
    splits = dict(seq_splits=seq, head_splits=heads)
    qh, kh = fu.qk_norm_rope_all_to_all_qk(
        group,
        local[0],
        local[1],
        ("q", "k"),
        norm_weights=(wq.to(device), wk.to(device)),
        eps=EPS,
        cos=angle[rows].cos().to(device),
        sin=angle[rows].sin().to(device),
        **splits,
    )
    vh = group.all_to_all_single_4d(local[2], 0, "v", **splits)
    out = group.all_to_all_single_4d(attention(qh, kh, vh), 1, "o", **splits)
    want = one_process(dtype)[:, rows]
    error = (out.float().cpu() - want.float()).abs().max()
    worst = torch.tensor([error.item()], device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    if rank == 0:
        path = (
            "fast path (UlyssesGroup, fused kernel)"
            if not group.fallback
            else f"torch.distributed fallback (TorchUlyssesGroup, unfused): {group.fallback_reason}"
        )
        print(f"{world_size} ranks on {'GPUs' if use_gpu else 'CPU'}, {path}")
        print(
            f"Wan attention block, {HEADS} heads (splits {heads}), {SEQ} tokens (splits {seq}), "
            f"{dtype}: max |sharded - one process| = {worst.item():.2e} "
            f"(tolerance {tolerance:g}): {'ok' if worst.item() <= tolerance else 'FAILED'}"
        )
    group.destroy()
    return worst.item() <= tolerance


if __name__ == "__main__":
    parser = _launch.parser(__doc__.split("\n\n")[0], cpu_ranks=CPU_RANKS)
    args = parser.parse_args()  # every argument checked before any rank starts
    world = _launch.world_size(parser, args, cpu_ranks=CPU_RANKS)
    sys.exit(_launch.launch(block, args, world))
