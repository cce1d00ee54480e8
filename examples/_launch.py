"""How every example starts its ranks: `python examples/<name>.py [--nproc P] [options]`.

Each example parses and checks all its arguments first (a bad value is argparse's one-line
error, exit 2, before any rank starts), then `launch` runs its `body(rank, world_size, device,
args)` on P ranks:

- started with python: it spawns P processes itself (`--nproc`; default one per visible GPU, up
  to the plan's rank limit, or the example's CPU rank count without a GPU);
- started by torchrun (RANK is set): this process is one of the launched ranks, and --nproc, if
  given, must equal torchrun's WORLD_SIZE.

With GPUs each rank takes its own GPU and NCCL (with `shared_gpu`, every rank cuda:0 over gloo,
FAST_ULYSSES_ALLOW_SHARED_GPU=1, a testing mode); without, CPU ranks over gloo. The example's
exit code is 0 when every rank's body returned True (or None), else 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fast_ulysses.plan import limits

MAX_RANKS = limits()["max_world_size"]  # one node: the plan's limit, read from the extension


def count(example: int, maximum: int | None = None):
    """An argparse type: an integer >= 1 (and <= maximum); a refusal names the value, the range
    and `example`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not an integer (e.g. {example})"
            ) from None
        if value < 1 or (maximum is not None and value > maximum):
            rule = ">= 1" if maximum is None else f"in [1, {maximum}]"
            raise argparse.ArgumentTypeError(
                f"{text!r} is out of range: it must be {rule} (e.g. {example})"
            )
        return value

    parse.__name__ = "count"
    return parse


def parser(doc: str, cpu_ranks: int) -> argparse.ArgumentParser:
    """The example's argument parser, with the one rank option every example has: --nproc."""
    p = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--nproc",
        type=count(cpu_ranks, maximum=MAX_RANKS),
        default=None,
        help=f"ranks, 1 to {MAX_RANKS} (default: one per GPU, or {cpu_ranks} CPU ranks without "
        "a GPU; under torchrun, the ranks it launched)",
    )
    return p


def world_size(parser: argparse.ArgumentParser, args, cpu_ranks: int, shared_gpu=False) -> int:
    """The rank count this run will have; a count the machine cannot give is parser.error."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if "RANK" in os.environ:  # torchrun chose it
        launched = int(os.environ["WORLD_SIZE"])
        if args.nproc is not None and args.nproc != launched:
            parser.error(
                f"--nproc is {args.nproc} but torchrun launched {launched} ranks: leave "
                f"--nproc out under torchrun, or give --nproc {launched}"
            )
        return launched
    if args.nproc is not None:
        if gpus and not shared_gpu and args.nproc > gpus:
            parser.error(
                f"--nproc is {args.nproc}: it must be at most the {gpus} visible GPUs, one "
                f"rank per GPU (e.g. --nproc {gpus})"
            )
        return args.nproc
    return min(gpus, MAX_RANKS) if gpus else cpu_ranks


def launch(body, args, world: int, *, backend: str | None = None, shared_gpu=False) -> int:
    """Runs `body(rank, world, device, args)` on `world` ranks (`world_size`): this process's
    rank under torchrun, else `world` spawned processes. The default process group is up during
    `body` (`backend`: default NCCL on GPUs, gloo with `shared_gpu` or without a GPU). Returns
    the exit code: 0 when every rank's body returned True or None."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # CPU ranks: nothing leaves the machine
    if shared_gpu:  # the opt-in, and multicast off as in every shared-GPU run
        os.environ["FAST_ULYSSES_ALLOW_SHARED_GPU"] = "1"
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if "RANK" in os.environ:
        _rank(int(os.environ["RANK"]), world, None, body, args, backend, shared_gpu)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        try:
            mp.spawn(_rank, args=(world, store, body, args, backend, shared_gpu), nprocs=world)
        except (mp.ProcessRaisedException, mp.ProcessExitedException):
            return 1  # the failing rank printed why
    return 0


def _rank(rank, world, store, body, args, backend, shared_gpu) -> None:
    """One rank: the process group, the body, then an exit without interpreter finalization
    (gloo work that outlives the process group can abort a process at exit: "terminate called
    without an active exception", seen in CI after every check had passed)."""
    gpu = torch.cuda.is_available()
    if gpu:
        local = 0 if shared_gpu else int(os.environ.get("LOCAL_RANK", rank))
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = backend or ("nccl" if gpu and not shared_gpu else "gloo")
    if store is None:  # torchrun's environment
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    ok = False
    try:
        ok = body(rank, world, device, args) in (True, None)
        # Every rank past its last collective before any tears its process group down: a rank
        # exiting while a peer's gloo transfer is still in flight can abort that peer at exit.
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
        print(f"rank {rank}: failed (above)", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)
