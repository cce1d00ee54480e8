"""Model shapes the CLIs know by name (the published shapes: bf16, d = 128)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._ints import as_int
from .errors import FastUlyssesError, refused


@dataclass(frozen=True)
class Preset:
    batch: int
    seq_len: int
    heads: int
    head_dim: int
    dtype: torch.dtype
    note: str


PRESETS: dict[str, Preset] = {
    "wan-720p": Preset(1, 75_600, 40, 128, torch.bfloat16, "Wan 2.1 14B, 720p x 81 frames"),
    "wan-480p": Preset(1, 32_760, 40, 128, torch.bfloat16, "Wan 2.1 14B, 480p x 81 frames"),
    "wan-1.3b-720p": Preset(
        1, 75_600, 12, 128, torch.bfloat16, "Wan 2.1 1.3B, 720p: 12 heads, uneven on 8 ranks"
    ),
    "hunyuan-720p": Preset(
        1,
        118_800,
        24,
        128,
        torch.bfloat16,
        "HunyuanVideo, 720p x 129 frames: 24 heads, uneven on 5 or 7",
    ),
}


def even_splits(total: int, world_size: int) -> list[int]:
    """`total` split as evenly as possible over `world_size` ranks, larger parts first."""
    return [total // world_size + (1 if r < total % world_size else 0) for r in range(world_size)]


def preset_call(name: str, world_size: int, rank: int, mode: int = 0) -> dict:
    """This rank's input shape (bshd), dtype and splits for a preset. Splits are passed only
    where they are uneven, so even presets exercise the default path. An unknown preset, or a
    world_size or rank the plan rejects, raises FastUlyssesError (a ValueError; for those two,
    past the int rule of `fast_ulysses.plan`, the plan's own)."""
    if name not in PRESETS:
        raise FastUlyssesError(f"preset {name!r}: must be one of {sorted(PRESETS)}")
    p = PRESETS[name]
    from ._ops import _C  # the plan's range first: even_splits builds a list of world_size

    world_size, rank = as_int(world_size, "world_size"), as_int(rank, "rank")
    try:
        _C.check_group(world_size, rank)
    except ValueError as error:
        raise refused(error) from None
    seq = even_splits(p.seq_len, world_size)
    heads = even_splits(p.heads, world_size)
    from .plan import input_shape  # world_size or rank out of range: the plan states the rule

    shape = input_shape(
        world_size,
        rank,
        mode,
        batch=p.batch,
        head_dim=p.head_dim,
        seq_splits=seq,
        head_splits=heads,
    )
    return dict(
        shape=shape,
        dtype=p.dtype,
        seq_splits=None if len(set(seq)) == 1 else seq,
        head_splits=None if len(set(heads)) == 1 else heads,
    )
