"""A tiny multi-rank worker for the launcher's own tests (test_launcher.py): two checks over a
gloo world started from torchrun's environment, the way every multi-rank worker starts.

    --fail NAME   rank 1 fails check NAME (sum_of_ranks or barrier) with a named error
    --sleep S     sleep S seconds before anything (a rank that hangs)
"""

from __future__ import annotations

import argparse
import sys
import time

from multirank import Report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", default="")
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    time.sleep(args.sleep)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    report = Report(rank)
    with report.check("sum_of_ranks") as entry:
        total = torch.tensor([rank])
        dist.all_reduce(total)
        assert total.item() == world_size * (world_size - 1) // 2, total
        assert not (args.fail == "sum_of_ranks" and rank == 1), "rank 1 was told to fail"
        entry["detail"] = f"{world_size} ranks"
    with report.check("barrier"):
        assert not (args.fail == "barrier" and rank == 1), "rank 1 was told to fail"
        dist.barrier()
    report.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
