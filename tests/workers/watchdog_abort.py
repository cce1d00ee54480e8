"""torchrun worker: a rank that never makes its call. Every rank makes one call on the tag (its
window is allocated then: a collective on the process group, on the host, which the watchdog does
not cover); then rank 0 calls again and the others sleep past the watchdog, so rank 0 waits on the
GPU for flags its peers never write. With FAST_ULYSSES_WATCHDOG_ACTION=abort (the default) rank 0's watchdog reports the
stuck call on stderr and ends the process non-zero, and torchrun tears the job down.

    FAST_ULYSSES_ALLOW_SHARED_GPU=1 FAST_ULYSSES_WATCHDOG_S=3 torchrun --nproc-per-node 2 \\
        tests/workers/watchdog_abort.py

Exits 0 only if the watchdog did not end the job, which the GPU test counts as a failure.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from multirank import parse_shared_gpu_only

import fast_ulysses as fu


def main() -> int:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(0)
    group = fu.UlyssesGroup(dist.group.WORLD, 1 << 20)
    x = torch.randn(1, 4, 2 * world_size, 64, dtype=torch.bfloat16, device="cuda")
    group.all_to_all_single_4d_borrowed(x, 0, "never-matched")  # every rank: the window exists
    torch.cuda.synchronize()
    print(f"rank {rank}: first call done", flush=True)
    if rank == 0:
        print(f"rank 0: issuing at {time.time():.3f}", flush=True)
        group.all_to_all_single_4d_borrowed(x, 0, "never-matched")
        torch.cuda.synchronize()  # waits on the GPU for peers that never call
        print("rank 0: the call completed, which it must not", flush=True)
    else:
        time.sleep(60)
    return 0


if __name__ == "__main__":
    parse_shared_gpu_only(__doc__)
    raise SystemExit(main())
