"""Strided views of a call's input, cut the way models hold q, k and v: the heads of a packed qkv
projection (`qkv.view(b, s, 3, N, d)[:, :, i]`, `qkv.narrow(2, i * N, N)`; bhsd: a (b, 3N, s, d)
narrowed), a window of a longer sequence, every other batch element, and a transpose of another
layout's storage. Each view holds exactly the values of a given tensor, so a call on the view
must give, bit for bit, the call on the tensor: what the packed-view checks of the gloo worker
(torch_group.py) and of the fast path (a2a_checks.py) compare.

The plan's source rule (csrc/plan/plan.h) reads every view here as it stands but `transposed`
(with more than one head and one row), which the fast path copies once with .contiguous().
"""

from __future__ import annotations

import torch

# Dimension positions of (batch, seq, heads) per layout (head_dim is last).
DIMS = {"bshd": (0, 1, 2), "sbhd": (1, 0, 2), "bhsd": (0, 2, 1)}
PACKINGS = ("qkv_view", "qkv_narrow", "seq_window", "batch_step", "transposed")
# The packings every layout reads through the input's strides, with no copy.
REGULAR = ("qkv_view", "qkv_narrow", "seq_window", "batch_step")


def _filled(shape, like: torch.Tensor) -> torch.Tensor:
    """A parent buffer of `shape` whose every byte is 0x5A: values no input has (randn * k)."""
    parent = torch.empty(shape, dtype=like.dtype, device=like.device)
    parent.view(torch.uint8).fill_(0x5A)
    return parent


def _qkv_view(x: torch.Tensor, layout: str, which: int) -> torch.Tensor:
    shape = list(x.shape)
    if layout == "bhsd":  # (b, 3, N, s, d)[:, which]
        parent = _filled([shape[0], 3, *shape[1:]], x)
        return parent[:, which]
    parent = _filled([*shape[:2], 3, *shape[2:]], x)  # (d0, d1, 3, N, d)[:, :, which]
    return parent[:, :, which]


def _widened(x: torch.Tensor, dim: int, factor: int, extra: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] = shape[dim] * factor + extra
    return _filled(shape, x)


def packed(x: torch.Tensor, layout: str, packing: str, which: int = 1) -> torch.Tensor:
    """A strided view holding x's values, of x's shape, cut by `packing` (PACKINGS); `which`
    picks q, k or v (0, 1, 2) of the qkv packings."""
    b_dim, s_dim, h_dim = DIMS[layout]
    if packing == "qkv_view":
        view = _qkv_view(x, layout, which)
    elif packing == "qkv_narrow":
        n = x.shape[h_dim]
        view = _widened(x, h_dim, 3, 0).narrow(h_dim, which * n, n)
    elif packing == "seq_window":
        view = _widened(x, s_dim, 1, 2).narrow(s_dim, 1, x.shape[s_dim])
    elif packing == "batch_step":
        index = [slice(None)] * 4
        index[b_dim] = slice(None, None, 2)
        view = _widened(x, b_dim, 2, 0)[tuple(index)]
    elif packing == "transposed":  # the storage of the dimensions the layout keeps apart
        a, b = (0, 1) if layout == "sbhd" else (1, 2)
        view = _filled(x.transpose(a, b).shape, x).transpose(a, b)
    else:
        raise ValueError(f"packing={packing!r}: must be one of {PACKINGS}")
    assert view.shape == x.shape, (packing, view.shape, x.shape)
    view.copy_(x)
    return view


def moves_as_it_stands(x: torch.Tensor, layout: str, packing: str) -> bool:
    """Whether the fast path reads `packed(x, layout, packing)` with no copy (plan.h's rule for
    these packings; the C++ tests hold the rule itself)."""
    if packing in REGULAR or packing == "contiguous" or x.numel() == 0:
        return True
    b_dim, s_dim, h_dim = DIMS[layout]
    other = b_dim if layout == "sbhd" else h_dim
    return x.shape[other] <= 1 or x.shape[s_dim] <= 1
