"""A Wan-like DiT attention block with Ulysses sequence parallelism, checked against one rank.

The block: q, k, v projections, RMSNorm of q and k over all heads (the whole hidden dimension,
as Wan does), rotary position embedding at each token's global position, attention
(`fast_ulysses.UlyssesAttention`: q, k, v to head shards, SDPA, the output back to sequence
shards), and the output projection. P ranks each hold a slice of the sequence; every rank also
runs the same block on the whole sequence in one process (the reference) and checks:

- forward: its output rows and x's gradient match the reference's;
- backward: the weight gradients, summed over ranks, match the reference's;
- training: a few SGD steps on random data give the same losses.

Uneven splits on purpose: heads that P does not divide (12 heads on 8 ranks by default with 8
GPUs; --heads 5 on 3 CPU ranks in the test) and a sequence that P does not divide.

With GPUs: one rank per GPU (up to 8; --nproc fewer), NCCL, bfloat16 (bf16 tolerances). With
--shared-gpu: --nproc ranks on the first GPU over gloo (FAST_ULYSSES_ALLOW_SHARED_GPU=1, a testing
mode: 12 heads on 8 ranks with one GPU). Without a GPU: --nproc CPU ranks (default 3) over gloo,
float32. Under torchrun it runs on the ranks torchrun launched. It prints what it ran and exits 1
if a check fails.

    python examples/wan_block.py [--nproc 3 --heads 12 --head-dim 64 --seq 1001 --steps 3]
    python examples/wan_block.py --shared-gpu --nproc 8
"""

from __future__ import annotations

import argparse
import copy
import math
import sys

import _launch  # how every example starts its ranks (examples/_launch.py)
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _launch import count

import fast_ulysses as fu
from fast_ulysses.plan import limits

CPU_RANKS = 3  # without a GPU


def even_splits(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if r < total % parts else 0) for r in range(parts)]


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (b, s, n, d) at `positions` (s,): pairs of channels rotated by
    position * 10000^(-2i/d)."""
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (s, d/2)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x0, x1 = x.float().unflatten(-1, (d // 2, 2)).unbind(-1)
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


class WanAttentionBlock(torch.nn.Module):
    """Self-attention of a Wan-like DiT block. `attention`: a UlyssesAttention for the
    sequence-parallel run, None for plain SDPA on the whole sequence."""

    def __init__(self, dim: int, heads: int, attention: torch.nn.Module | None = None):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = torch.nn.RMSNorm(dim, eps=1e-6), torch.nn.RMSNorm(dim, eps=1e-6)
        self.attention = attention

    def forward(self, x, positions, seq_splits=None, head_splits=None):
        b, s, dim = x.shape
        shape = (b, s, self.heads, dim // self.heads)
        q = rope(self.norm_q(self.q(x)).view(shape), positions)
        k = rope(self.norm_k(self.k(x)).view(shape), positions)
        v = self.v(x).view(shape)
        if self.attention is None:
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            ).transpose(1, 2)
        else:
            o = self.attention(q, k, v, seq_splits=seq_splits, head_splits=head_splits)
        return self.o(o.reshape(b, s, dim))


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b| (0 for two zero tensors)."""
    scale = b.float().abs().max().item() or 1.0
    return (a.float() - b.float()).abs().max().item() / scale


def all_reduce_(t: torch.Tensor, backend: str, op=dist.ReduceOp.SUM) -> None:
    """In-place all-reduce; through the CPU on gloo (ranks sharing a GPU)."""
    if backend == "nccl" or t.device.type == "cpu":
        dist.all_reduce(t, op=op)
        return
    host = t.cpu()
    dist.all_reduce(host, op=op)
    t.copy_(host)


def block(rank: int, world_size: int, device: torch.device, args) -> bool:
    use_gpu = device.type == "cuda"
    backend = dist.get_backend()
    dtype = torch.bfloat16 if use_gpu else torch.float32
    tolerance = 5e-2 if use_gpu else 1e-4  # bfloat16 keeps 8 bits of mantissa
    seq, heads = even_splits(args.seq, world_size), even_splits(args.heads, world_size)
    start, rows = sum(seq[:rank]), seq[rank]
    dim = args.heads * args.head_dim

    torch.manual_seed(0)  # the same weights and data on every rank
    reference = WanAttentionBlock(dim, args.heads).to(device, dtype)
    group = fu.make_group(dist.group.WORLD)
    model = copy.deepcopy(reference)
    model.attention = fu.UlyssesAttention(group)
    data = [
        (
            torch.randn(args.batch, args.seq, dim, device=device, dtype=dtype),
            torch.randn(args.batch, args.seq, dim, device=device, dtype=dtype),
        )
        for _ in range(args.steps)
    ]
    positions = torch.arange(args.seq, device=device)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=args.lr)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    report, ref_losses, losses = {}, [], []
    for step, (x_full, target) in enumerate(data):
        # The reference: the whole sequence in this process.
        x_ref = x_full.clone().requires_grad_()
        out_ref = reference(x_ref, positions)
        loss_ref = F.mse_loss(out_ref.float(), target.float(), reduction="sum") / target.numel()
        loss_ref.backward()
        # This rank's shard, through Ulysses.
        x = x_full[:, start : start + rows].clone().requires_grad_()
        out = model(x, positions[start : start + rows], seq_splits=seq, head_splits=heads)
        local = (
            F.mse_loss(out.float(), target[:, start : start + rows].float(), reduction="sum")
            / target.numel()
        )
        local.backward()
        for p in model.parameters():  # the data-parallel-style sum of the ranks' gradients
            all_reduce_(p.grad, backend)
        loss = local.detach().clone()
        all_reduce_(loss, backend)
        if step == 0:
            report["forward"] = max_rel(out.detach(), out_ref.detach()[:, start : start + rows])
            report["x.grad"] = max_rel(x.grad, x_ref.grad[:, start : start + rows])
            report["weight grads"] = max(
                max_rel(p.grad, r.grad) for p, r in zip(model.parameters(), reference.parameters())
            )
        ref_losses.append(loss_ref.item())
        losses.append(loss.item())
        ref_opt.step(), opt.step()
        ref_opt.zero_grad(), opt.zero_grad()
    report["losses"] = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    ok = torch.tensor([int(all(v <= tolerance for v in report.values()))], device=device)
    all_reduce_(ok, backend, op=dist.ReduceOp.MIN)
    if rank == 0:
        kind = (
            "fast path (UlyssesGroup)"
            if not group.fallback
            else f"torch.distributed fallback (TorchUlyssesGroup: {group.fallback_reason})"
        )
        where = (
            ("one shared GPU (gloo), bfloat16" if args.shared_gpu else "GPUs, bfloat16")
            if use_gpu
            else "CPU (gloo), float32"
        )
        print(f"Wan-like attention block: {world_size} ranks on {where}, {kind}")
        print(
            f"{args.heads} heads of {args.head_dim} (head_splits {heads}), sequence "
            f"{args.seq} (seq_splits {seq}), batch {args.batch}, {args.steps} SGD steps"
        )
        for name, value in report.items():
            print(f"  {name:13s} max relative difference to one rank: {value:.2e}")
        print(
            f"  losses: P ranks {[f'{v:.6f}' for v in losses]}, one rank "
            f"{[f'{v:.6f}' for v in ref_losses]}"
        )
        print(f"every check within {tolerance:g}: {bool(ok.item())}")
    group.destroy()
    return bool(ok.item())


def finite(text: str) -> float:
    """An argparse type: a finite float."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number (e.g. 0.5)")
    return value


def check(args, world_size: int, use_gpu: bool) -> str:
    """What in `args` this run cannot take on `world_size` ranks ("" when nothing)."""
    if args.heads < world_size:
        return (
            f"--heads is {args.heads}: it must be at least the {world_size} ranks, one head "
            f"or more on every rank (e.g. --heads {max(world_size, 12)})"
        )
    if args.seq < world_size:
        return (
            f"--seq is {args.seq}: it must be at least the {world_size} ranks, one row or "
            f"more on every rank (e.g. --seq {max(world_size, 1001)})"
        )
    if args.head_dim % 2:
        return (
            f"--head-dim is {args.head_dim}: it must be even, RoPE rotates pairs of "
            f"channels (e.g. --head-dim {args.head_dim + 1})"
        )
    dim = args.heads * args.head_dim
    element_size = 2 if use_gpu else 4  # bfloat16 on GPUs, float32 on the CPU
    limit = limits()["max_bytes"]  # fast-ulysses' limit on one tensor
    for what, nbytes in (
        (
            f"--batch {args.batch} --seq {args.seq} --heads {args.heads} "
            f"--head-dim {args.head_dim}: an activation",
            args.batch * args.seq * dim * element_size,
        ),
        (
            f"--heads {args.heads} --head-dim {args.head_dim}: a projection weight",
            dim * dim * element_size,
        ),
    ):
        if nbytes > limit:
            return (
                f"{what} is {nbytes:.4g} bytes: it must be at most 2^"
                f"{limit.bit_length() - 1} bytes (fast_ulysses.plan.limits())"
            )
    return ""


def main() -> int:
    parser = _launch.parser(__doc__, cpu_ranks=CPU_RANKS)
    parser.add_argument("--heads", type=count(12), default=12)
    parser.add_argument("--head-dim", type=count(64), default=64, help="an even number")
    parser.add_argument("--seq", type=count(1001), default=1001, help="total sequence length")
    parser.add_argument("--batch", type=count(1), default=1)
    parser.add_argument("--steps", type=count(3), default=3, help="SGD steps")
    parser.add_argument("--lr", type=finite, default=0.5)
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="every rank on the first GPU, over gloo (a testing mode)",
    )
    args = parser.parse_args()  # every argument checked before any rank starts
    use_gpu = torch.cuda.is_available()
    if args.shared_gpu and not use_gpu:
        parser.error("--shared-gpu: no CUDA GPU is visible")
    world_size = _launch.world_size(parser, args, CPU_RANKS, shared_gpu=args.shared_gpu)
    problem = check(args, world_size, use_gpu)
    if problem:
        parser.error(problem)
    return _launch.launch(block, args, world_size, shared_gpu=args.shared_gpu)


if __name__ == "__main__":
    sys.exit(main())
