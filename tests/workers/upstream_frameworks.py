"""One rank of the test against the installed frameworks themselves (tests/python/
test_integrations.py, gloo CPU ranks; P = 1, 2, 3 as the last P ranks of the world; with
--shared-gpu, tests/gpu/test_upstream_gpu.py: every rank on cuda:0, ours on the fast group,
upstream's functions on the same CUDA tensors over the gloo process group, one launch per P),
those named by --frameworks (yunchang, diffusers, deepspeed). Bit for bit, forward and, where
upstream has one, every input's gradient:
- fast_group_P<p> (--shared-gpu only): the registry's group is the fast one;
- upstream_comm_P<p>: fast_ulysses.integrations.yunchang's all_to_all_4D (both ways, forward:
  yunchang's has no backward), SeqAllToAll4D and SeqAllToAll5D (both ways) against
  yunchang.comm.all_to_all's own;
- upstream_attention_P<p>: yunchang's UlyssesAttention layer with its own all-to-alls, then the
  same layer after patch_yunchang() (fast-ulysses' all-to-alls; the rebinding undone after).
  The layer's attention function is SDPA's math backend, the same in both runs (yunchang's
  torch backends call the CUDA-only flash kernel; the math backend's backward is deterministic
  on a GPU too);
- upstream_diffusers_P<p>: fast_ulysses.integrations.diffusers._all_to_all_dim_exchange both
  ways against diffusers' own (forward: diffusers' has no backward);
- upstream_deepspeed_P<p>: fast_ulysses.integrations.deepspeed.DistributedAttention against
  deepspeed.sequence.layer.DistributedAttention with the same local attention, batch_dim_idx 0
  and 1, without and with rotary_pos_emb (partial rotary; (S, 1, 1, r) tables for bshd,
  (b, S, 1, r) for sbhd).
Every rank's input is different, so a chunk sent to the wrong rank shows.
"""

from __future__ import annotations

import sys

import integrations as adapters
import torch
import torch.distributed as dist
import torch.nn.functional as F
from multirank import (
    check_fast_group,
    framework_check_names,
    parse_framework_args,
    run_framework_checks,
    run_on_subgroups,
)
from torch.nn.attention import SDPBackend, sdpa_kernel

from fast_ulysses.attention import group_for
from fast_ulysses.integrations import deepspeed as ours_deepspeed
from fast_ulysses.integrations import diffusers as ours_diffusers
from fast_ulysses.integrations import yunchang as ours

# yunchang's own callables, kept (by main, before any patch_yunchang() rebinds the module's
# names). The frameworks are imported there and in the checks, so that the test can name the
# checks without them.
UPSTREAM: dict = {}


def rank_input(shape, seed, device):
    g = torch.Generator().manual_seed(seed * 100 + dist.get_rank())
    return torch.randn(shape, generator=g).to(device)


def compare(label, f_ours, f_upstream, shape, seed, device, grad=True):
    """The adapter worker's comparison, both on `device`, upstream as the reference (grad=False
    where upstream has no backward: yunchang's plain all_to_all_4D, diffusers' exchange)."""
    adapters.compare(label, f_ours, f_upstream, shape, device, seed, grad, ref_device=device)


def check_comm(pg, P, device):
    up = UPSTREAM
    seq_in, head_in = (2, 3, 2 * P, 8), (2, 3 * P, 2, 8)
    compare(
        "all_to_all_4D(2, 1)",
        lambda x: ours.all_to_all_4D(x, 2, 1, pg),
        lambda x: up["all_to_all_4D"](x, 2, 1, pg),
        seq_in,
        1,
        device,
        grad=False,
    )
    compare(
        "all_to_all_4D(1, 2)",
        lambda x: ours.all_to_all_4D(x, 1, 2, pg),
        lambda x: up["all_to_all_4D"](x, 1, 2, pg),
        head_in,
        2,
        device,
        grad=False,
    )
    compare(
        "SeqAllToAll4D(2, 1)",
        lambda x: ours.SeqAllToAll4D.apply(pg, x, 2, 1),
        lambda x: up["SeqAllToAll4D"].apply(pg, x, 2, 1),
        seq_in,
        3,
        device,
    )
    compare(
        "SeqAllToAll4D(1, 2)",
        lambda x: ours.SeqAllToAll4D.apply(pg, x, 1, 2),
        lambda x: up["SeqAllToAll4D"].apply(pg, x, 1, 2),
        head_in,
        6,
        device,
    )
    compare(
        "SeqAllToAll5D(3, 1)",
        lambda x: ours.SeqAllToAll5D.apply(pg, x, 3, 1),
        lambda x: up["SeqAllToAll5D"].apply(pg, x, 3, 1),
        (2, 3, 3, 2 * P, 8),
        4,
        device,
    )
    compare(
        "SeqAllToAll5D(1, 3)",
        lambda x: ours.SeqAllToAll5D.apply(pg, x, 1, 3),
        lambda x: up["SeqAllToAll5D"].apply(pg, x, 1, 3),
        (2, 3 * P, 3, 2, 8),
        5,
        device,
    )


def sdpa(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **_):
    """The layer's attention function, (b, s, h, d) in and out: SDPA's math backend."""
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q, k, v)), scale=softmax_scale, is_causal=causal
        )
    return o.transpose(1, 2)


def check_attention(pg, P, device):
    from yunchang.kernels import AttnType
    from yunchang.ulysses.attn_layer import UlyssesAttention

    layer = UlyssesAttention(pg, attn_type=AttnType.TORCH_MATH)
    layer.attn_fn = sdpa
    q, k, v = (rank_input((2, 3, 2 * P, 8), seed, device) for seed in (10, 11, 12))
    w = rank_input((2, 3, 2 * P, 8), 13, device)

    def run():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = layer(*leaves, causal=True)
        (out * w).sum().backward()
        return [out.detach()] + [t.grad for t in leaves]

    want = run()
    patched = ours.patch_yunchang()
    try:
        assert "yunchang.ulysses.attn_layer.SeqAllToAll4D" in patched, patched
        assert sys.modules["yunchang.ulysses.attn_layer"].SeqAllToAll4D is ours.SeqAllToAll4D
        got = run()
    finally:
        for entry in patched:
            module, name = entry.rsplit(".", 1)
            setattr(sys.modules[module], name, UPSTREAM[name])
    for label, a, b in zip(("output", "q.grad", "k.grad", "v.grad"), got, want):
        assert adapters.same_bits(a, b), f"UlyssesAttention after patch_yunchang: {label} differs"


def check_diffusers(pg, P, device):
    from diffusers.models.attention_dispatch import _all_to_all_dim_exchange as upstream

    compare(
        "_all_to_all_dim_exchange(2, 1)",
        lambda x: ours_diffusers._all_to_all_dim_exchange(x, 2, 1, pg),
        lambda x: upstream(x, 2, 1, pg),
        (2, 3, 2 * P, 8),
        20,
        device,
        grad=False,
    )
    compare(
        "_all_to_all_dim_exchange(1, 2)",
        lambda x: ours_diffusers._all_to_all_dim_exchange(x, 1, 2, pg),
        lambda x: upstream(x, 1, 2, pg),
        (2, 3 * P, 2, 8),
        21,
        device,
        grad=False,
    )


def check_deepspeed(pg, P, device):
    from deepspeed.sequence.layer import DistributedAttention as Upstream

    g = torch.Generator().manual_seed(31)
    seq_first = (torch.rand(3 * P, 1, 1, 4, generator=g) * 6.28).to(device)  # (S, 1, 1, r): bshd
    per_batch = (torch.rand(2, 3 * P, 1, 4, generator=g) * 6.28).to(device)  # (b, S, 1, r): sbhd
    cases = [
        ("batch_dim_idx=0", 0, "bshd", (2, 3, 2 * P, 8), None),
        ("batch_dim_idx=1", 1, "sbhd", (3, 2, 2 * P, 8), None),
        (
            "batch_dim_idx=0 with rotary_pos_emb",
            0,
            "bshd",
            (2, 3, 2 * P, 8),
            (seq_first.cos(), seq_first.sin()),
        ),
        (
            "batch_dim_idx=1 with rotary_pos_emb",
            1,
            "sbhd",
            (3, 2, 2 * P, 8),
            (per_batch.cos(), per_batch.sin()),
        ),
    ]
    for n, (label, batch_dim_idx, layout, shape, rotary) in enumerate(cases):

        def run(cls):
            module = cls(adapters.local_attention, pg)
            return lambda x: module(x, x * 2, x + 1, batch_dim_idx, rotary, layout)

        compare(
            f"DistributedAttention {label}",
            run(ours_deepspeed.DistributedAttention),
            run(Upstream),
            shape,
            30 + n,
            device,
        )


# framework -> its checks (name, function)
CHECKS = {
    "yunchang": (("upstream_comm", check_comm), ("upstream_attention", check_attention)),
    "diffusers": (("upstream_diffusers", check_diffusers),),
    "deepspeed": (("upstream_deepspeed", check_deepspeed),),
}


def main() -> int:
    args, frameworks = parse_framework_args(CHECKS)
    if "yunchang" in frameworks:
        import yunchang.comm.all_to_all as upstream

        UPSTREAM.update(
            all_to_all_4D=upstream.all_to_all_4D,
            SeqAllToAll4D=upstream.SeqAllToAll4D,
            SeqAllToAll5D=upstream.SeqAllToAll5D,
        )

    def body(report, pg, P, device):
        if "deepspeed" in frameworks:  # its comm layer over the process group torch set up
            import deepspeed

            deepspeed.init_distributed(dist_backend="gloo")
        if args.shared_gpu:
            check_fast_group(report, pg, P)
        run_framework_checks(report, pg, P, CHECKS, frameworks, device)
        group_for(pg).destroy()  # the registry's group for pg (collective)

    return run_on_subgroups(args.shared_gpu, body)


def check_names(world: int, shared_gpu: bool = False) -> list[tuple[str, str]]:
    """(framework, check name) of every framework check at every P; with shared_gpu at P = world
    only (one launch per P), after the launch's multirank.FAST_GROUP_CHECK."""
    return framework_check_names(CHECKS, world, shared_gpu)


if __name__ == "__main__":
    sys.exit(main())
