"""One rank of the framework-adapter test (tests/python/test_integrations.py on gloo CPU ranks;
with --shared-gpu, tests/gpu/test_autograd_gpu.py runs it on the fast group).

The reference is this file's own re-implementation of each upstream API's documented meaning:
permute/reshape around `torch.distributed.nn.functional.all_to_all_single` (differentiable),
even splits, as those APIs require. Per P (the last P ranks of the world), forward and the
input's gradient must match it bit for bit:
- yunchang_P<p>: all_to_all_4D both ways, SeqAllToAll4D, SeqAllToAll5D both ways;
- deepspeed_P<p>: DistributedAttention, batch_dim_idx 0 (bshd) and 1 (sbhd), without and with
  rotary_pos_emb (partial rotary; cos/sin per batch entry in sbhd);
- diffusers_P<p>: _all_to_all_dim_exchange both ways;
- fastvideo_P<p>: all_to_all_4D both ways.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
import torch.nn.functional as F
from multirank import run_on_subgroups, subgroup_sizes
from torch.nn.attention import SDPBackend, sdpa_kernel

from fast_ulysses.attention import group_for
from fast_ulysses.integrations import deepspeed, diffusers, fastvideo, yunchang

# -- the reference: upstream semantics, written from their documentation ----------------------


def _a2a(x, pg):
    """Chunk p of dim 0 goes to rank p; what arrives from rank p is chunk p of the result."""
    x = x.contiguous()
    return dnn.all_to_all_single(torch.empty(x.shape, dtype=x.dtype), x, group=pg)


def ref_seq_to_head(x, pg):
    """(bs, s/P, hc, hs) -> (bs, s, hc/P, hs)."""
    P = dist.get_world_size(pg)
    bs, sl, hc, hs = x.shape
    chunks = x.reshape(bs, sl, P, hc // P, hs).permute(2, 1, 0, 3, 4)  # (P, s/P, bs, hc/P, hs)
    got = _a2a(chunks, pg)  # got[p]: rank p's rows of my heads
    return got.reshape(P * sl, bs, hc // P, hs).transpose(0, 1).contiguous()


def ref_head_to_seq(x, pg):
    """(bs, s, hc/P, hs) -> (bs, s/P, hc, hs)."""
    P = dist.get_world_size(pg)
    bs, s, hl, hs = x.shape
    chunks = x.reshape(bs, P, s // P, hl, hs).permute(1, 3, 0, 2, 4)  # (P, hc/P, bs, s/P, hs)
    got = _a2a(chunks, pg)  # got[p]: rank p's heads of my rows
    return got.permute(2, 3, 0, 1, 4).reshape(bs, s // P, P * hl, hs)


def ref_4d(x, scatter, gather, pg):
    return ref_seq_to_head(x, pg) if (scatter, gather) == (2, 1) else ref_head_to_seq(x, pg)


def ref_5d(x, scatter, gather, pg):
    parts = [
        ref_4d(x[:, :, i].contiguous(), 2 if scatter == 3 else 1, 1 if scatter == 3 else 2, pg)
        for i in range(x.shape[2])
    ]
    return torch.stack(parts, dim=2)


# -- checks -----------------------------------------------------------------------------------


def same_bits(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def compare(label, ours, ref, x_shape, device, seed, grad=True, ref_device=None):
    """ours(x), ref(x) on one random input, different on every rank (so a chunk sent to the
    wrong rank shows): forward and, with grad, x.grad bit for bit (grad=False where the
    reference has no backward). Ours runs on `device`, the reference on `ref_device` (default
    the CPU, over gloo)."""
    ref_device = ref_device or torch.device("cpu")
    g = torch.Generator().manual_seed(seed * 100 + dist.get_rank())
    x = torch.randn(x_shape, generator=g)
    xa, xb = (x.clone().to(d).requires_grad_(grad) for d in (device, ref_device))
    a, b = ours(xa), ref(xb)
    assert same_bits(a.detach().cpu(), b.detach().cpu()), (
        f"{label}: forward differs from the reference"
    )
    if not grad:
        return
    w = torch.randn(a.shape, generator=g)
    (a * w.to(device)).sum().backward()
    (b * w.to(ref_device)).sum().backward()
    assert same_bits(xa.grad.cpu(), xb.grad.cpu()), f"{label}: x.grad differs from the reference"


def local_attention(q, k, v, layout):
    """DistributedAttention's local attention: SDPA on (b, s, h, d) or (s, b, h, d).

    Contiguous inputs: SDPA picks its kernel by memory layout, so the same values in another
    layout could take another kernel on a GPU and differ in the last bits. The math backend:
    deterministic in backward too (the fused kernels' backward may accumulate in a different
    order from one run to the next)."""
    order = (0, 2, 1, 3) if layout == "bshd" else (1, 2, 0, 3)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(*(t.permute(order).contiguous() for t in (q, k, v)))
    return o.permute([order.index(i) for i in range(4)])


def check_yunchang(pg, P, device):
    seq_in, head_in = (2, 2, 2 * P, 8), (2, 2 * P, 2, 8)
    compare(
        "all_to_all_4D(2, 1)",
        lambda x: yunchang.all_to_all_4D(x, 2, 1, pg),
        lambda x: ref_4d(x, 2, 1, pg),
        seq_in,
        device,
        1,
    )
    compare(
        "all_to_all_4D(1, 2)",
        lambda x: yunchang.all_to_all_4D(x, 1, 2, pg, True),
        lambda x: ref_4d(x, 1, 2, pg),
        head_in,
        device,
        2,
    )
    compare(
        "SeqAllToAll4D",
        lambda x: yunchang.SeqAllToAll4D.apply(pg, x, 2, 1),
        lambda x: ref_4d(x, 2, 1, pg),
        seq_in,
        device,
        3,
    )
    compare(
        "SeqAllToAll5D(3, 1)",
        lambda x: yunchang.SeqAllToAll5D.apply(pg, x),
        lambda x: ref_5d(x, 3, 1, pg),
        (2, 2, 3, 2 * P, 8),
        device,
        4,
    )
    compare(
        "SeqAllToAll5D(1, 3)",
        lambda x: yunchang.SeqAllToAll5D.apply(pg, x, 1, 3),
        lambda x: ref_5d(x, 1, 3, pg),
        (2, 2 * P, 3, 2, 8),
        device,
        5,
    )


def check_deepspeed(pg, P, device):
    for batch_dim_idx, layout in ((0, "bshd"), (1, "sbhd")):
        module = deepspeed.DistributedAttention(local_attention, pg)

        def ours(x):
            q, k, v = x, x * 2, x + 1
            return module(q, k, v, batch_dim_idx, None, layout)

        def ref(x):
            # The all-to-alls on CPU (gloo), the attention on `device` as in `ours`: SDPA on CPU
            # and on a GPU round differently, so only the same kernel on the same inputs is
            # bit-exact.
            to_bshd = (lambda t: t) if layout == "bshd" else (lambda t: t.transpose(0, 1))
            q, k, v = (to_bshd(ref_4d(to_bshd(t), 2, 1, pg)).to(device) for t in (x, x * 2, x + 1))
            o = local_attention(q, k, v, layout).cpu()
            return to_bshd(ref_4d(to_bshd(o).contiguous(), 1, 2, pg))

        shape = (2, 3, 2 * P, 8) if layout == "bshd" else (3, 2, 2 * P, 8)
        compare(
            f"DistributedAttention batch_dim_idx={batch_dim_idx}",
            ours,
            ref,
            shape,
            device,
            10 + batch_dim_idx,
        )

    # rotary_pos_emb: DeepSpeed's (cos, sin) tables, viewed as table.permute(1, 0, 2, 3), which
    # broadcasts to q's first r values after the all-to-all; rotate-half on those r values of q
    # and k. r = 4 of d = 8 (partial rotary); (S, 1, 1, r) tables for bshd, (b, S, 1, r) ones
    # (an angle per batch entry) for sbhd.
    g = torch.Generator().manual_seed(12)
    for batch_dim_idx, layout, table in (
        (0, "bshd", (3 * P, 1, 1, 4)),
        (1, "sbhd", (2, 3 * P, 1, 4)),
    ):
        angles = torch.rand(table, generator=g) * 6.28
        cos, sin = angles.cos(), angles.sin()
        module = deepspeed.DistributedAttention(local_attention, pg)
        to_bshd = (lambda t: t) if layout == "bshd" else (lambda t: t.transpose(0, 1))

        def ours_rotary(x):
            return module(x, x * 2, x + 1, batch_dim_idx, (cos.to(device), sin.to(device)), layout)

        def ref_rotary(x):
            def rotate(t):  # the first half of r against the second, angles broadcast
                c, s = cos.permute(1, 0, 2, 3), sin.permute(1, 0, 2, 3)
                half = c.shape[-1] // 2
                x1, x2 = t[..., :half], t[..., half : 2 * half]
                return torch.cat(
                    (
                        x1 * c[..., :half] - x2 * s[..., :half],
                        x2 * c[..., half:] + x1 * s[..., half:],
                        t[..., 2 * half :],
                    ),
                    -1,
                )

            q, k, v = (to_bshd(ref_4d(to_bshd(t), 2, 1, pg)) for t in (x, x * 2, x + 1))
            q, k = rotate(q), rotate(k)
            o = local_attention(*(t.to(device) for t in (q, k, v)), layout).cpu()
            return to_bshd(ref_4d(to_bshd(o).contiguous(), 1, 2, pg))

        shape = (2, 3, 2 * P, 8) if layout == "bshd" else (3, 2, 2 * P, 8)
        compare(
            f"DistributedAttention batch_dim_idx={batch_dim_idx} with rotary_pos_emb",
            ours_rotary,
            ref_rotary,
            shape,
            device,
            13 + batch_dim_idx,
        )


def check_diffusers(pg, P, device):
    compare(
        "_all_to_all_dim_exchange(2, 1)",
        lambda x: diffusers._all_to_all_dim_exchange(x, 2, 1, pg),
        lambda x: ref_4d(x, 2, 1, pg),
        (1, 3, 2 * P, 8),
        device,
        20,
    )
    compare(
        "_all_to_all_dim_exchange(1, 2)",
        lambda x: diffusers._all_to_all_dim_exchange(x, 1, 2, pg),
        lambda x: ref_4d(x, 1, 2, pg),
        (1, 3 * P, 2, 8),
        device,
        21,
    )


def check_fastvideo(pg, P, device):
    compare(
        "all_to_all_4D(2, 1)",
        lambda x: fastvideo.all_to_all_4D(x, 2, 1, group=pg),
        lambda x: ref_4d(x, 2, 1, pg),
        (2, 3, P, 8),
        device,
        30,
    )
    compare(
        "all_to_all_4D(1, 2)",
        lambda x: fastvideo.all_to_all_4D(x, 1, 2, group=pg),
        lambda x: ref_4d(x, 1, 2, pg),
        (2, 3 * P, 1, 8),
        device,
        31,
    )


CHECKS = (
    ("yunchang", check_yunchang),
    ("deepspeed", check_deepspeed),
    ("diffusers", check_diffusers),
    ("fastvideo", check_fastvideo),
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="every rank on cuda:0 (make_group picks the fast group)",
    )
    args = parser.parse_args()

    def body(report, pg, P, device):
        for name, fn in CHECKS:
            with report.check(f"{name}_P{P}"):
                fn(pg, P, device)
        group_for(pg).destroy()  # the registry's group for pg (collective)

    return run_on_subgroups(args.shared_gpu, body)


def check_names(world: int, shared_gpu: bool = False) -> list[str]:
    return [f"{name}_P{P}" for P in subgroup_sizes(world, shared_gpu) for name, _ in CHECKS]


if __name__ == "__main__":
    sys.exit(main())
