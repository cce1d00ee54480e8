"""One rank of the UlyssesAttention test (tests/python/test_attention.py on gloo CPU ranks; with
--shared-gpu, tests/gpu/test_autograd_gpu.py runs it on the fast group).

For P = 1..world_size (the last P ranks), with the module built from the subgroup's
ProcessGroup (the registry's group) and both layouts, even and uneven splits (heads that P does
not divide, a sequence it does not divide):
- attention_P<p>: forward and q/k/v gradients match single-process SDPA over the whole
  sequence and every head (float32 tolerances), and the inference path (borrowed q, k, v and one
  barrier, under no_grad) gives the training path's output (same tolerances);
- registry_P<p>: group_for(pg) builds one group per ProcessGroup and returns it again.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fast_ulysses as fu
from fast_ulysses.attention import group_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from multirank import run_on_subgroups, subgroup_sizes  # noqa: E402

D = 8


def split_cases(P):
    if P == 1:
        return [("even", None, None)]
    return [("even", None, None),
            ("uneven", [3, 2, 0][:P] if P == 3 else [3, 2], [2, 1, 2][:P])]


def full_inputs(P, seq, heads, layout, seed, device):
    S = sum(seq) if seq else 2 * P
    N = sum(heads) if heads else 2 * P
    g = torch.Generator().manual_seed(seed)
    full = [torch.randn(2, S, N, D, generator=g) for _ in range(4)]  # q, k, v, output weight
    if layout == "sbhd":
        full = [t.transpose(0, 1).contiguous() for t in full]
    return [t.to(device) for t in full], S


def check_attention(pg, P, device) -> int:
    rank = dist.get_rank(pg)
    module = fu.UlyssesAttention(pg)
    count = 0
    for (name, seq, heads), layout in itertools.product(split_cases(P), ("bshd", "sbhd")):
        (q, k, v, w), S = full_inputs(P, seq, heads, layout, 100 * P + count, device)
        rows = seq or [S // P] * P
        start, n = sum(rows[:rank]), rows[rank]
        s_dim = layout.index("s")
        # The reference: one process, every head, the whole sequence.
        qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
        to_bhsd = (0, 2, 1, 3) if layout == "bshd" else (1, 2, 0, 3)
        back = [to_bhsd.index(i) for i in range(4)]
        of = F.scaled_dot_product_attention(*(t.permute(to_bhsd) for t in (qf, kf, vf)))
        of = of.permute(back)
        (of * w).sum().backward()
        # This rank's shards.
        ql, kl, vl = (t.narrow(s_dim, start, n).contiguous().requires_grad_()
                      for t in (q, k, v))
        kw = dict(seq_splits=seq, head_splits=heads, layout=layout)
        out = module(ql, kl, vl, **kw)
        want = of.detach().narrow(s_dim, start, n)
        torch.testing.assert_close(out.detach(), want, msg=lambda m: f"{name} {layout}: {m}")
        (out * w.narrow(s_dim, start, n)).sum().backward()
        for label, local, ref in (("q", ql, qf), ("k", kl, kf), ("v", vl, vf)):
            torch.testing.assert_close(local.grad, ref.grad.narrow(s_dim, start, n),
                                       msg=lambda m: f"{name} {layout} {label}.grad: {m}")
        with torch.no_grad():
            infer = module(ql, kl, vl, **kw)
        # SDPA may pick another kernel without grad (on a GPU): close, not bit-exact.
        torch.testing.assert_close(infer, out.detach(),
                                   msg=lambda m: f"{name} {layout} inference path: {m}")
        count += 1
    return count


def check_registry(pg, P, device) -> None:
    group = group_for(pg)
    assert group is group_for(pg), "the registry built a second group for one ProcessGroup"
    assert group.world_size == P and fu.UlyssesAttention(group).group is group


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared-gpu", action="store_true",
                        help="every rank on cuda:0 (make_group picks the fast group)")
    args = parser.parse_args()

    def body(report, pg, P, device):
        with report.check(f"attention_P{P}") as entry:
            entry["detail"] = f"{check_attention(pg, P, device)} cases"
        with report.check(f"registry_P{P}"):
            check_registry(pg, P, device)
        group_for(pg).destroy()

    return run_on_subgroups(args.shared_gpu, body)


def check_names(world: int, shared_gpu: bool = False) -> list[str]:
    return [f"{c}_P{P}" for P in subgroup_sizes(world, shared_gpu) for c in ("attention", "registry")]


if __name__ == "__main__":
    sys.exit(main())
