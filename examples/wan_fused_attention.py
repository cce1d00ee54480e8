"""A Wan 2.1 attention block with the fused QK RMSNorm + RoPE scatter, against one process.

Each rank holds its rows of the sequence. q and k go through `qk_norm_rope_all_to_all_qk`
(RMSNorm over all heads, interleaved RoPE, then the mode-0 all-to-all, one closing handshake for
both), v through the plain borrowed all-to-all, then SDPA on this rank's heads and the mode-1
all-to-all of the output back to its rows. The result is compared with the same block computed
unsharded in one process.

With GPUs: one rank per GPU (up to 8) over NCCL, UlyssesGroup where make_group picks it (the
fused kernel). Without a GPU: 3 CPU ranks over gloo, TorchUlyssesGroup (the same math unfused).
12 heads and a sequence the rank count does not divide: uneven splits throughout.

    python examples/wan_fused_attention.py [--ranks P]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import fast_ulysses as fu
from fast_ulysses.fused import norm_rope_reference
from fast_ulysses.presets import even_splits

HEADS, HEAD_DIM, BATCH, SEQ, EPS = 12, 64, 1, 101, 1e-6


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


def worker(rank: int, world_size: int, store: str, use_gpu: bool) -> None:
    dist.init_process_group(
        "nccl" if use_gpu else "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
    )
    device = torch.device("cuda", rank) if use_gpu else torch.device("cpu")
    if use_gpu:
        torch.cuda.set_device(device)
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
    # Every rank past its last collective before any tears its process group down: a rank
    # exiting while a peer's gloo transfer is still in flight can abort that peer at exit.
    dist.barrier()
    group.destroy()
    dist.destroy_process_group()
    # Leave without interpreter finalization: gloo work that outlives the process group can
    # abort a spawned process at exit ("terminate called without an active exception", seen in
    # CI after every check had passed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if worst.item() <= tolerance else 1)


def rank_count(text: str) -> int:
    """An argparse type: a rank count, 1 to 8 (one node)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (e.g. 3)") from None
    if not 1 <= value <= 8:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: it must be in [1, 8] (e.g. 3)")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ranks",
        type=rank_count,
        default=None,
        help="ranks, 1 to 8 (default: one per GPU up to 8, or 3 CPU ranks)",
    )
    args = parser.parse_args()
    use_gpu = torch.cuda.is_available()
    if use_gpu and args.ranks and args.ranks > torch.cuda.device_count():
        parser.error(
            f"--ranks is {args.ranks}: it must be at most the "
            f"{torch.cuda.device_count()} visible GPUs, one rank per GPU (e.g. --ranks "
            f"{torch.cuda.device_count()})"
        )
    world_size = args.ranks or (min(torch.cuda.device_count(), 8) if use_gpu else 3)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(world_size, os.path.join(tmp, "store"), use_gpu), nprocs=world_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
