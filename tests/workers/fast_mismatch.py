"""torchrun worker: ranks that disagree on a call's head splits, without FAST_ULYSSES_DEBUG.

Every rank first makes matching calls on two tags ("keep" and "bad"), then a call on "bad" where
rank 0 passes head_splits=[N - P + 1, 1, ..., 1] and every other rank the default even splits.
The handshake carries each call's signature, so no rank copies anything into a peer's window:
every rank's call waits, and its watchdog (FAST_ULYSSES_WATCHDOG_S; the test sets 5 s and the
action 'report') reports the wait naming the peer whose release was for a different call. Each
rank then ends itself with exit code 3, once its report is out (a GPU wait cannot be
cancelled).

Before that, while the call waits on the GPU, each rank checks on a stream of its own that
  - the window of "keep" still holds the matching call's result, bit for bit;
  - no element of a peer's mismatched input (each rank fills it with a constant of its own)
    reached this rank's window of "bad",
and prints "rank R: windows intact". The GPU test requires that line and the report on every
rank, and a non-zero exit.

    FAST_ULYSSES_ALLOW_SHARED_GPU=1 FAST_ULYSSES_WATCHDOG_S=5 torchrun --nproc-per-node 2 \\
        tests/workers/fast_mismatch.py
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from multirank import parse_shared_gpu_only

import fast_ulysses as fu


def main() -> int:
    dist.init_process_group("gloo")
    rank, P = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(0)
    group = fu.UlyssesGroup(dist.group.WORLD, 64 << 20)
    heads, s, d = 2 * P, 8, 64
    g = torch.Generator().manual_seed(rank)
    keep_in = torch.randn(1, s, heads, d, generator=g).to(torch.bfloat16)
    everyone = [
        torch.randn(1, s, heads, d, generator=torch.Generator().manual_seed(r)).to(torch.bfloat16)
        for r in range(P)
    ]
    keep_want = fu.simulate(everyone, 0)[rank]
    keep = group.all_to_all_single_4d_borrowed(keep_in.cuda(), 0, "keep")
    assert torch.equal(keep.cpu(), keep_want), f"rank {rank}: the matching call is wrong"
    # A matching call on "bad" with a larger batch: the tag's window is big enough for the
    # mismatched call too (no rank grows the pool, which is a host collective).
    group.all_to_all_single_4d_borrowed(
        torch.randn(4, s, heads, d, device="cuda").to(torch.bfloat16), 0, "bad"
    )
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    dist.barrier()
    marker = float(256 * (rank + 1))  # exact in bf16, never drawn by randn
    bad_in = torch.full((1, s, heads, d), marker, dtype=torch.bfloat16, device="cuda")
    splits = [heads - P + 1] + [1] * (P - 1) if rank == 0 else None
    print(f"rank {rank}: mismatched call, head_splits={splits}", flush=True)
    bad = group.all_to_all_single_4d_borrowed(bad_in, 0, "bad", head_splits=splits)
    window = bad.elem if hasattr(bad, "elem") else bad
    time.sleep(1.0)  # a peer's copies, had any been issued, would have landed by now
    # Device-to-host copies on a stream of their own, and no kernel: the caller's stream and the
    # communication stream wait for the peers, and with CUDA's lazy module loading the first
    # launch of a kernel could wait for the whole device.
    with torch.cuda.stream(side):
        kept = (keep.elem if hasattr(keep, "elem") else keep).to("cpu")
        seen = window.to("cpu")
    assert torch.equal(kept, keep_want), f"rank {rank}: the window of 'keep' changed"
    for peer in range(P):
        if peer != rank:
            stray = (seen == 256 * (peer + 1)).sum().item()
            assert stray == 0, (
                f"rank {rank}: {stray} elements of rank {peer}'s mismatched "
                "input landed in this rank's window"
            )
    print(f"rank {rank}: windows intact", flush=True)
    time.sleep(10)  # past the watchdog's report
    os._exit(3)


if __name__ == "__main__":
    parse_shared_gpu_only(__doc__)
    raise SystemExit(main())
