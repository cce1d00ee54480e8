"""`fast-ulysses bench`: the stage-by-stage benchmark on real model shapes, side by side.

    torchrun --nproc-per-node 8 -m fast_ulysses.bench --preset wan-720p
    fast-ulysses bench --nproc 4 --shared-gpu          # 4 ranks sharing cuda:0 (testing)

Under torchrun it uses the launched ranks; otherwise it spawns --nproc ranks itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from types import SimpleNamespace

import torch
import torch.distributed as dist

from .. import plan as make_plan
from ..cli._args import integer, integers
from ..cli._help import HelpFormatter
from ..head_groups import head_groups
from ..plan import DTYPE_NAMES
from ..presets import PRESETS, even_splits
from ..topology import MAX_RANKS
from . import usp, wire

# The payloads the benchmark's presets are measured in: a subset of fast_ulysses.plan's names.
DTYPES = {name: DTYPE_NAMES[name] for name in ("bf16", "fp16")}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="stage-by-stage benchmark against the baseline",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(run=run)


def gemm_count(text: str):
    """--gemms: "auto" (sized to the collective's time) or a fixed count (0: no overlap)."""
    if text == "auto":
        return text
    return integer("4 or auto", minimum=0)(text)


def full_shape(text: str) -> list[int]:
    """--shape: b,S,N,d, four integers >= 1."""
    shape = integers(text, example="1,75600,40,128")
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: it must be 4 comma-separated integers >= 1, b,S,N,d (e.g. 1,75600,40,128)"
        )
    return shape


def mode_list(text: str) -> list[int]:
    """--modes: comma-separated modes, each 0 or 1."""
    modes = integers(text, example="0,1")
    if not set(modes) <= {0, 1}:
        raise argparse.ArgumentTypeError(f"{text!r}: every mode must be 0 or 1 (e.g. 0,1)")
    return modes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        action="append",
        choices=sorted(PRESETS),
        help="repeatable; default: every preset unless --shape is given",
    )
    p.add_argument(
        "--shape", type=full_shape, help="custom full shape b,S,N,d (sequence and heads unsplit)"
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="element type")
    tokens = integer(256, minimum=0)
    p.add_argument("--text-tokens", type=tokens, default=0, help="tokens added to every sequence")
    p.add_argument("--modes", type=mode_list, default="0,1", help="modes to run, comma-separated")
    p.add_argument(
        "--iters", type=integer(50, minimum=1), default=50, help="timed calls per median"
    )
    p.add_argument(
        "--warmup", type=integer(10, minimum=0), default=10, help="untimed calls before them"
    )
    p.add_argument(
        "--gemm-size",
        type=integer(8192, minimum=1),
        default=8192,
        help="overlap GEMM size (with --gemms auto: the largest tried)",
    )
    p.add_argument(
        "--gemms",
        type=gemm_count,
        default="auto",
        help="GEMMs in the overlap chain: auto (a chain about as long as the "
        "collective), a count, or 0 to skip the overlap",
    )
    p.add_argument(
        "--overlap-repeats",
        type=integer(5, minimum=1),
        default=5,
        help="overlap measurements per collective (median and spread reported)",
    )
    p.add_argument(
        "--graph",
        action="store_true",
        help="also time CUDA-graph replays of one captured call of each entry point",
    )
    p.add_argument(
        "--fused",
        action="store_true",
        help="mode 0 also times the fused QK RMSNorm + RoPE scatter against the "
        "unfused torch sequence and the plain borrowed call",
    )
    p.add_argument(
        "--pipeline",
        type=integer(2, minimum=0),
        default=0,
        help="mode 0 also times UlyssesAttention's forward (no grad) with pipeline=G "
        "head groups against pipeline=1 (0: no attention row)",
    )
    p.add_argument(
        "--ring-degree",
        type=usp.ring_degree_option,
        default=0,
        help="mode 0 also times UlyssesAttention's forward (no grad) over rings of R x "
        "Ulysses groups of P/R ranks against plain Ulysses over all P (R = 1: ring_attention with no ring "
        "against SDPA; auto: 2 where P is even, 1 at P = 1; an R that does not divide P: the "
        "row says it is skipped; 0: no USP row)",
    )
    wire.add_argument(p)
    p.add_argument(
        "--nproc",
        type=integer(4, minimum=1, maximum=MAX_RANKS),
        default=None,
        help=f"ranks to spawn when not under torchrun, 1 to {MAX_RANKS} (default: GPU count)",
    )
    p.add_argument(
        "--shared-gpu",
        action="store_true",
        help="every rank on cuda:0 over gloo (sets FAST_ULYSSES_ALLOW_SHARED_GPU=1)",
    )
    p.add_argument(
        "--out-dir",
        default="fast-ulysses-results",
        help="where JSON and PNG go, one timestamped pair per run (relative paths "
        "start at the current directory)",
    )
    p.add_argument("--label", default=None, help="file name label (default: p<P>[-shared])")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")


def cases(args, world_size: int) -> list:
    from .stages import Case

    dtype = DTYPES[args.dtype]
    specs = []
    if args.shape:
        b, s, n, d = args.shape
        specs.append(("custom", b, s, n, d))
    for name in args.preset or ([] if args.shape else sorted(PRESETS)):
        p = PRESETS[name]
        specs.append((name, p.batch, p.seq_len, p.heads, p.head_dim))
    out = []
    for name, b, s, n, d in specs:
        s += args.text_tokens
        heads = even_splits(n, world_size)
        out.append(Case(name, b, even_splits(s, world_size), heads, d, dtype))
        if s % world_size:  # what padding costs: the baseline's usual fix, a padded sequence
            padded = -(-s // world_size) * world_size
            out.append(Case(f"{name}-padded", b, even_splits(padded, world_size), heads, d, dtype))
    return out


def padding_notes(case_list: list, world_size: int) -> list[str]:
    """One line per case: which padded twin measures what padding costs, or 'not applicable'."""
    names = {c.name for c in case_list}
    notes = []
    for c in case_list:
        if c.name.endswith("-padded"):
            continue
        seq = sum(c.seq_splits)
        twin = f"{c.name}-padded"
        if twin in names:
            notes.append(
                f"{c.name}: sequence {seq} is not a multiple of P={world_size}: "
                f"compare the baseline on {twin} (padded to "
                f"{-(-seq // world_size) * world_size}) with fast-ulysses on {c.name} "
                "(uneven seq_splits, no padding)"
            )
        else:
            notes.append(
                f"{c.name}: not applicable (sequence {seq} is a multiple of P={world_size})"
            )
    return notes


def machine(world_size: int, shared: bool) -> dict:
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpus_visible": torch.cuda.device_count(),
        "driver": _driver(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "world_size": world_size,
        "shared_gpu": shared and world_size > 1,
    }


def _driver() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


def worker(args) -> dict | None:
    """Runs every case on this rank; rank 0 returns the results dict (slowest rank)."""
    import fast_ulysses as fu

    from .report import slowest
    from .stages import run_case

    rank, P = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", 0 if args.shared_gpu else int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    ctx = SimpleNamespace(
        rank=rank,
        device=device,
        iters=args.iters,
        warmup=args.warmup,
        fast=fu.UlyssesGroup(dist.group.WORLD, 0, require_nvlink=False),  # (PCIe too)
        gemm_size=args.gemm_size,
        gemms=args.gemms,
        overlap_repeats=args.overlap_repeats,
        graph=args.graph,
        fused=args.fused,
        pipeline=args.pipeline,
        ring_degree=args.ring_degree,
        wire=args.wire,
    )
    ctx.baseline_group, note = dist.group.WORLD, "torch.distributed all_to_all_single (NCCL)"
    if args.shared_gpu and P > 1:
        ctx.baseline_group, note = None, "n/a: NCCL cannot run with ranks sharing one GPU"
    elif args.shared_gpu:
        ctx.baseline_group = dist.new_group([0], backend="nccl")
    modes = args.modes
    todo = [(c, m) for c in cases(args, P) for m in modes]
    entries = []
    for case, mode in _progress(todo, rank == 0):
        mine = run_case(case, mode, ctx)
        gathered = [None] * P
        dist.all_gather_object(gathered, mine)
        entries.append(
            {
                "case": case.name,
                "mode": mode,
                "seq_splits": case.seq_splits,
                "head_splits": case.head_splits,
                "result": slowest(gathered),
            }
        )
    usp.close(ctx)
    ctx.fast.destroy()
    if rank != 0:
        return None
    padding = padding_notes(cases(args, P), P)
    return {
        "machine": machine(P, args.shared_gpu),
        "args": vars(args),
        "cases": entries,
        "baseline_note": note,
        "padding": padding,
    }


def _progress(items, show: bool):
    if not show:
        yield from items
        return
    from rich.progress import track

    yield from track(items, description="benchmarking")


def report(results: dict, args) -> None:
    from .report import print_table, write_json, write_plot

    print_table(results)
    label = args.label or f"p{results['machine']['world_size']}" + (
        "-shared" if args.shared_gpu else ""
    )
    path = write_json(results, args.out_dir, label)
    print(f"results: {path}")
    plot = None if args.no_plot else write_plot(results, path.with_suffix(".png"))
    if plot:
        print(f"plot: {plot}")


def _spawned(rank: int, world_size: int, store: str, args) -> None:
    dist.init_process_group(
        "gloo" if args.shared_gpu else "nccl",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
    )
    _run_rank(args)


def _run_rank(args) -> None:
    results = worker(args)
    if results is not None:
        report(results, args)
    dist.destroy_process_group()


def check(args, world_size: int) -> str:
    """What the benchmark cannot run on `world_size` ranks, "" when nothing: the checks the
    options' types cannot make alone, by the plan's own rules (e.g. its limit on one tensor's
    bytes) for rank 0 of every case in every mode (even splits: rank 0 holds the most rows and
    heads), and with --pipeline and --nproc, UlyssesAttention's rule for G."""
    for case in cases(args, world_size):
        source = (
            "--shape " + ",".join(map(str, args.shape))
            if case.name.startswith("custom")
            else f"--preset {case.name.removesuffix('-padded')}"
        )
        padded = " (padded)" if case.name.endswith("-padded") else ""
        tokens = f" with --text-tokens {args.text_tokens}" if args.text_tokens else ""
        for mode in args.modes:
            try:
                make_plan(
                    world_size, 0, mode, case.input_shape(0, mode), case.dtype, **case.kwargs()
                )
            except ValueError as error:
                return f"{source}{tokens}{padded} on {world_size} ranks, mode {mode}: {error}"
        if args.pipeline and 0 in args.modes and args.nproc:  # (else P waits for the GPUs)
            try:  # UlyssesAttention's own rule for G
                head_groups(tuple(case.head_splits), sum(case.head_splits), args.pipeline)
            except ValueError as error:
                return (
                    f"{source}{padded} on {world_size} ranks, --pipeline {args.pipeline}: {error}"
                )
    return ""


def run(args: argparse.Namespace) -> int:
    # Every argument is checked before the GPU is looked for (the plan's rules on the tensors
    # do not depend on the rank count, which the GPU count may decide).
    problem = check(args, args.nproc or MAX_RANKS)
    if problem:
        print(f"fast-ulysses bench: error: {problem}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(
            "fast-ulysses bench: no CUDA GPU visible; nothing measured (use `fast-ulysses "
            "plan` or `fast_ulysses.simulate` on this machine)",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if args.shared_gpu:
        os.environ["FAST_ULYSSES_ALLOW_SHARED_GPU"] = "1"
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("gloo" if args.shared_gpu else "nccl")
        _run_rank(args)
        return 0
    import torch.multiprocessing as mp

    nproc = args.nproc or torch.cuda.device_count()
    if nproc > torch.cuda.device_count() and not args.shared_gpu:
        print(
            f"fast-ulysses bench: --nproc {nproc} needs {nproc} GPUs (one per rank over "
            f"NCCL) but {torch.cuda.device_count()} are visible; add --shared-gpu to put "
            "every rank on cuda:0 (a testing mode: not NVLink numbers)",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_spawned, args=(nproc, os.path.join(tmp, "store"), args), nprocs=nproc)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="fast-ulysses bench", description=__doc__, formatter_class=HelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
