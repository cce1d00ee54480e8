"""`fast-ulysses plan`: prints one rank's copy plan (descriptors, bytes per peer); GPU-free."""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
from rich.console import Console
from rich.table import Table

from .. import plan as make_plan
from ..plan import DTYPE_NAMES, LAYOUTS, CopyDescriptor
from ..presets import PRESETS, preset_call
from ..topology import MAX_RANKS
from ._args import integer, integers, integers_like
from ._help import HelpFormatter

DTYPES = DTYPE_NAMES  # one table of dtype names, fast_ulysses.plan's


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="print the copy plan of one rank (no GPU needed)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    call = p.add_mutually_exclusive_group(required=True)
    call.add_argument("--preset", choices=sorted(PRESETS), help="a model shape")
    call.add_argument(
        "--shape",
        type=integers,
        help="this rank's input shape in --layout order (b,s,n,d for bshd)",
    )
    p.add_argument(
        "--world-size",
        type=integer(8, minimum=1, maximum=MAX_RANKS),
        required=True,
        help=f"ranks in the group (1 to {MAX_RANKS})",
    )
    p.add_argument("--rank", type=integer(0), default=0, help="the rank whose plan is printed")
    p.add_argument(
        "--mode",
        type=integer(0),
        default=0,
        choices=(0, 1),
        help="0: (b, s/P, N, d) -> (b, S, N/P, d); 1: the inverse",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="element type (default: the preset's, bf16 with --shape)",
    )
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="bshd",
        metavar="LAYOUT",
        help=f"{', '.join(LAYOUTS)}: order of --shape",
    )
    p.add_argument(
        "--seq-splits",
        type=integers_like("4,3,3 for 3 ranks"),
        help="rows of every rank, comma-separated (default: even, or the preset's)",
    )
    p.add_argument(
        "--head-splits",
        type=integers_like("2,1,1 for 3 ranks"),
        help="heads of every rank, comma-separated (default: even, or the preset's)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the plan as one JSON object instead of a table"
    )
    p.set_defaults(run=run, parser=p)


def _request(args) -> dict:
    if args.preset:
        call = preset_call(args.preset, args.world_size, args.rank, mode=args.mode)
        extent = dict(zip("bshd", call["shape"]))  # the preset's bshd shape, in --layout order
        call["shape"] = tuple(extent[axis] for axis in args.layout)
        if args.dtype:
            call["dtype"] = DTYPES[args.dtype]
    else:
        call = dict(
            shape=tuple(args.shape),
            dtype=DTYPES[args.dtype or "bf16"],
            seq_splits=None,
            head_splits=None,
        )
    if args.seq_splits:
        call["seq_splits"] = args.seq_splits
    if args.head_splits:
        call["head_splits"] = args.head_splits
    return call


def plan_dict(p, dtype: torch.dtype) -> dict:
    """The plan as JSON-ready data: the call, shapes, splits, window and every descriptor by
    field name (bytes included); `bytes_per_peer[j]` is what this rank writes to rank j."""
    return {
        "world_size": p.world_size,
        "rank": p.rank,
        "mode": p.mode,
        "layout": p.layout,
        "dtype": str(dtype).removeprefix("torch."),
        "element_size": p.element_size,
        "input_shape": list(p.input_shape),
        "output_shape": list(p.output_shape),
        "seq_splits": p.seq_splits,
        "head_splits": p.head_splits,
        "window_bytes": p.window_bytes,
        "total_bytes": p.total_bytes,
        "remote_bytes": p.remote_bytes,
        "bytes_per_peer": [d.bytes for d in p],
        "descriptors": [dataclasses.asdict(d) | {"bytes": d.bytes} for d in p],
    }


def run(args: argparse.Namespace) -> int:
    parser = getattr(args, "parser", None) or argparse.ArgumentParser(prog="fast-ulysses plan")
    try:
        call = _request(args)
        p = make_plan(
            args.world_size,
            args.rank,
            args.mode,
            call["shape"],
            call["dtype"],
            seq_splits=call["seq_splits"],
            head_splits=call["head_splits"],
            layout=args.layout,
        )
    except ValueError as error:  # the plan's own rule, stated once there
        parser.error(str(error))  # exits 2
    if args.json:
        print(json.dumps(plan_dict(p, call["dtype"]), indent=2))
        return 0
    console = Console()
    console = Console(width=max(console.width, 150))  # 11 numeric columns: never squeeze them
    title = (
        f"rank {p.rank} of {p.world_size}, mode {p.mode}, {p.layout}, {call['dtype']}: "
        f"{p.input_shape} -> {p.output_shape}"
    )
    table = Table(title=title)
    names = [f.name for f in dataclasses.fields(CopyDescriptor)]
    for column in ("peer", "bytes", *names[1:]):
        table.add_column(column, justify="right")
    for d in p:
        table.add_row(
            f"{d.peer}{' (self)' if d.peer == p.rank else ''}",
            f"{d.bytes:,}",
            *(f"{getattr(d, name):,}" for name in names[1:]),
        )
    console.print(table)
    console.print(f"seq_splits {p.seq_splits}; head_splits {p.head_splits}")
    console.print(
        f"total {p.total_bytes:,} bytes; to peers {p.remote_bytes:,} bytes; "
        f"own share {p.total_bytes - p.remote_bytes:,} bytes; window "
        f"{p.window_bytes:,} bytes on every rank"
    )
    return 0
