"""How `TorchUlyssesGroup` moves one checked call's data over `torch.distributed`.

How one call moves data. Let `split` be the dimension the sender cuts (heads in mode 0,
sequence in mode 1) and `cat` the one the receiver joins (sequence in mode 0, heads in mode 1).
Every chunk travels in the order "cat first, then the other dimensions in layout order", so that
the receive buffer is the output with `cat` moved to the front: a regular tensor whatever the
splits. The sender copies its chunks into that order (one pass over x); the receiver permutes
back (one pass), and skips even that where the permuted view is already contiguous (sbhd mode 0,
or bshd mode 0 with b == 1). Either way the result has waited for the collective (on NCCL a
stream wait, not a host block), so a result that is never used leaves no unwaited work behind.
Bytes travel as uint8, so every 1-, 2- and 4-byte dtype is moved bit for bit.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from .plan import Plan


def _axes(p: Plan) -> tuple[int, list[int], list[int], list[int]]:
    """(split dim, sender's splits, receiver's splits, chunk order) of a call."""
    dims = {axis: k for k, axis in enumerate(p.layout)}  # a layout's name is its axis order
    if p.mode == 0:
        split, cat, send, recv = dims["h"], dims["s"], p.head_splits, p.seq_splits
    else:
        split, cat, send, recv = dims["s"], dims["h"], p.seq_splits, p.head_splits
    order = [cat] + [k for k in range(4) if k != cat]
    return split, send, recv, order


def exchange(x: torch.Tensor, p: Plan, group, out: torch.Tensor | None = None) -> torch.Tensor:
    """Moves one checked call's data: returns the output, written into `out` when given."""
    split, send_splits, recv_splits, order = _axes(p)
    es = x.element_size()
    xs = x.permute(order)
    pos = order.index(split)
    send = torch.empty(x.numel(), dtype=x.dtype, device=x.device)
    in_bytes, offset = [], 0
    for start, count in _ranges(send_splits):
        chunk = xs.narrow(pos, start, count)
        send[offset : offset + chunk.numel()].view(chunk.shape).copy_(chunk)
        offset += chunk.numel()
        in_bytes.append(chunk.numel() * es)
    out_c = [p.output_shape[k] for k in order]  # the output, cat dimension first
    row = math.prod(out_c[1:]) * es  # bytes of one cat-dimension slice
    out_bytes = [count * row for count in recv_splits]
    if out is not None and all(p.output_shape[k] == 1 for k in range(order[0])):
        # The output in "cat first" order is out itself (only size-1 dimensions precede cat):
        # receive straight into it.
        dist.all_to_all_single(
            out.view(-1).view(torch.uint8), send.view(torch.uint8), out_bytes, in_bytes, group=group
        )
        return out
    recv = funcol.all_to_all_single(send.view(torch.uint8), out_bytes, in_bytes, group)
    if isinstance(recv, funcol.AsyncCollectiveTensor):
        # Wait now (a stream wait on NCCL): an AsyncCollectiveTensor that is never used would
        # leave its work unwaited, and torch warns about that at exit.
        recv = recv.wait()
    result = recv.view(x.dtype).view(out_c).permute(_inverse(order))
    if out is not None:
        return out.copy_(result)
    return result if result.is_contiguous() else result.contiguous()


def _ranges(splits):
    start = 0
    for count in splits:
        yield start, count
        start += count


def _inverse(order: list[int]) -> list[int]:
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return inverse
