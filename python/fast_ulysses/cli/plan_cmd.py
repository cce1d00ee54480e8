"""`fast-ulysses plan`: prints one rank's copy plan (descriptors, bytes per peer); GPU-free."""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table

from .. import plan as make_plan
from ..presets import PRESETS, preset_call

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "fp8": torch.float8_e4m3fn, "int8": torch.int8}


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="print the copy plan of one rank (no GPU needed)",
                              description=__doc__)
    p.add_argument("--preset", choices=sorted(PRESETS), help="a model shape")
    p.add_argument("--shape", type=_ints, help="this rank's input shape b,s,n,d (in --layout order)")
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--mode", type=int, default=0, choices=(0, 1))
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16")
    p.add_argument("--layout", choices=("bshd", "sbhd"), default="bshd")
    p.add_argument("--seq-splits", type=_ints)
    p.add_argument("--head-splits", type=_ints)
    p.set_defaults(run=run)


def _request(args) -> dict:
    if (args.preset is None) == (args.shape is None):
        raise SystemExit("fast-ulysses plan: give exactly one of --preset and --shape")
    if args.preset:
        call = preset_call(args.preset, args.world_size, args.rank, mode=args.mode)
        if args.layout == "sbhd":
            b, s, *rest = call["shape"]
            call["shape"] = (s, b, *rest)
        if args.dtype:
            call["dtype"] = DTYPES[args.dtype]
    else:
        call = dict(shape=tuple(args.shape), dtype=DTYPES[args.dtype or "bf16"],
                    seq_splits=None, head_splits=None)
    if args.seq_splits:
        call["seq_splits"] = args.seq_splits
    if args.head_splits:
        call["head_splits"] = args.head_splits
    return call


def run(args: argparse.Namespace) -> int:
    call = _request(args)
    try:
        p = make_plan(args.world_size, args.rank, args.mode, call["shape"], call["dtype"],
                      seq_splits=call["seq_splits"], head_splits=call["head_splits"],
                      layout=args.layout)
    except ValueError as error:
        Console(stderr=True).print(f"[red]fast-ulysses plan: {error}[/red]")
        return 2
    console = Console()
    console = Console(width=max(console.width, 150))  # 11 numeric columns: never squeeze them
    title = (f"rank {p.rank} of {p.world_size}, mode {p.mode}, {p.layout}, {call['dtype']}: "
             f"{p.input_shape} -> {p.output_shape}")
    table = Table(title=title)
    for column in ("peer", "bytes", "src_offset", "dst_offset", "width", "height", "depth",
                   "src_pitch", "dst_pitch", "src_slice_pitch", "dst_slice_pitch"):
        table.add_column(column, justify="right")
    for d in p:
        table.add_row(f"{d.peer}{' (self)' if d.peer == p.rank else ''}", f"{d.bytes:,}",
                      *(f"{v:,}" for v in d.as_list()[1:]))
    console.print(table)
    console.print(f"seq_splits {p.seq_splits}; head_splits {p.head_splits}")
    console.print(f"total {p.total_bytes:,} bytes; to peers {p.remote_bytes:,} bytes; "
                  f"own share {p.total_bytes - p.remote_bytes:,} bytes; window "
                  f"{p.window_bytes:,} bytes on every rank")
    return 0
