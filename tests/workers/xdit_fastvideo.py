"""One rank of tests/python/test_xdit_fastvideo.py (gloo CPU ranks; P = 1, 2, 3 as the last P
ranks of the world; with --shared-gpu, tests/gpu/test_upstream_gpu.py: every rank on cuda:0,
ours on the fast group, upstream's functions on the same CUDA tensors over the gloo process
group, one launch per P): fast-ulysses' xDiT and FastVideo adapters against the functions the
real packages define (imported as upstream_nodeps.py describes), bit for bit, forward and every
input's gradient:
- fast_group_P<p> (--shared-gpu only): the registry's group is the fast one;
- xfuser_usp_P<p>: fast_ulysses.integrations.xfuser's input_all_to_all, output_all_to_all,
  combined_qkv_all_to_all and combined_gqa_qkv_all_to_all against xfuser.model_executor.layers
  .usp's _ft_c_input_all_to_all, _ft_c_output_all_to_all, _combined_qkv_all_to_all and
  _combined_gqa_qkv_all_to_all, with the group passed and with group=None (xDiT's Ulysses
  group). xDiT's are not differentiable (torch's functional all_to_all_single: their results
  have no grad_fn), ours are: each input's gradient must equal xDiT's reverse all-to-all of the
  output's weight (an all-to-all is a permutation; its adjoint is its inverse). xDiT's read
  their group and size from its parallel state, which
  `initialize_model_parallel` fills on a real run; here the USP module's PROCESS_GROUP and
  get_ulysses_parallel_world_size are set to this group (the only stand-ins).
- xfuser_patch_P<p>: patch_xfuser() rebinds the four in the USP module (so USP(), and xDiT's FP8
  path, which looks them up there at call time, use ours), the results equal xDiT's own, and
  unpatch_xfuser() restores xDiT's.
- fastvideo_P<p>: fast_ulysses.integrations.fastvideo.all_to_all_4D, (2, 1) and (1, 2), against
  fastvideo.distributed.device_communicators.base_device_communicator's
  DistributedAutograd.AllToAll4D and DeviceCommunicatorBase(group).all_to_all_4D (what
  FastVideo's sequence_model_parallel_all_to_all_4D runs on CPU, and on GPU where its fused
  helper declines).
Every rank's input is different, so a chunk sent to the wrong rank shows.
"""

from __future__ import annotations

import sys
import types

import integrations as adapters
import torch
import torch.distributed as dist
import upstream_nodeps as upstream
from multirank import (
    check_fast_group,
    framework_check_names,
    parse_framework_args,
    run_framework_checks,
    run_on_subgroups,
)

from fast_ulysses.attention import group_for
from fast_ulysses.integrations import fastvideo as ours_fastvideo
from fast_ulysses.integrations import xfuser as ours_xfuser

USP = "xfuser.model_executor.layers.usp"
NAMES = (
    "_ft_c_input_all_to_all",
    "_ft_c_output_all_to_all",
    "_combined_qkv_all_to_all",
    "_combined_gqa_qkv_all_to_all",
)


def rank_inputs(shapes, seed, device):
    g = torch.Generator().manual_seed(seed * 100 + dist.get_rank())
    return [torch.randn(shape, generator=g).to(device) for shape in shapes]


def compare_many(label, f_ours, f_theirs, shapes, seed, device):
    """f(*inputs) -> a tensor or a tuple of them: every output and every input's gradient, bit
    for bit."""
    xs = rank_inputs(shapes, seed, device)
    results = []
    for f in (f_ours, f_theirs):
        leaves = [x.clone().requires_grad_() for x in xs]
        out = f(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        g = torch.Generator().manual_seed(seed)
        sum((o * torch.randn(o.shape, generator=g).to(device)).sum() for o in outs).backward()
        results.append(([o.detach() for o in outs], [x.grad for x in leaves]))
    (a_out, a_grad), (b_out, b_grad) = results
    assert len(a_out) == len(b_out), f"{label}: {len(a_out)} outputs, upstream {len(b_out)}"
    for i, (a, b) in enumerate(zip(a_out, b_out)):
        assert adapters.same_bits(a, b), f"{label}: output {i} differs from upstream's"
    for i, (a, b) in enumerate(zip(a_grad, b_grad)):
        assert adapters.same_bits(a, b), f"{label}: input {i}'s gradient differs from upstream's"


def compare_usp(label, f_ours, f_theirs, inverse, shapes, seed, device):
    """Outputs bit for bit against xDiT's; each input's gradient against `inverse` (xDiT's
    reverse all-to-all) of the weight its output got."""
    xs = rank_inputs(shapes, seed, device)
    leaves = [x.clone().requires_grad_() for x in xs]
    got, want = f_ours(*leaves), f_theirs(*xs)
    got, want = (t if isinstance(t, tuple) else (t,) for t in (got, want))
    assert len(got) == len(want), f"{label}: {len(got)} outputs, xDiT's {len(want)}"
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, generator=g).to(device) for o in got]
    for i, (a, b) in enumerate(zip(got, want)):
        assert adapters.same_bits(a.detach(), b), f"{label}: output {i} differs from xDiT's"
    sum((o * w).sum() for o, w in zip(got, weights)).backward()
    for i, (leaf, w) in enumerate(zip(leaves, weights)):
        assert adapters.same_bits(leaf.grad, inverse(w)), (
            f"{label}: input {i}'s gradient differs from xDiT's reverse all-to-all"
        )


def usp_module(pg, P):
    usp = upstream.load("xfuser", USP)
    # xDiT's parallel state, as initialize_model_parallel would set it for this group.
    usp.PROCESS_GROUP = types.SimpleNamespace(ULYSSES_PG=pg)
    usp.get_ulysses_parallel_world_size = lambda: P
    return usp


def usp_cases(P):
    """(our function, xDiT's name, input shapes (b, h, s, d), label, xDiT's reverse)."""
    seq_in, head_in = (2, 2 * P, 3, 8), (2, 2, 3 * P, 8)
    return [
        (ours_xfuser.input_all_to_all, NAMES[0], [seq_in], "input", NAMES[1]),
        (ours_xfuser.output_all_to_all, NAMES[1], [head_in], "output", NAMES[0]),
        (ours_xfuser.combined_qkv_all_to_all, NAMES[2], [seq_in] * 4, "combined qkv + 1", NAMES[1]),
        (
            ours_xfuser.combined_gqa_qkv_all_to_all,
            NAMES[3],
            [(2, 4 * P, 3, 8), seq_in, seq_in],
            "combined GQA qkv",
            NAMES[1],
        ),
    ]


def check_usp(pg, P, device):
    usp = usp_module(pg, P)
    for n, (mine, name, shapes, label, reverse) in enumerate(usp_cases(P)):
        theirs, inverse = getattr(usp, name), getattr(usp, reverse)
        compare_usp(
            f"{label} ({name}), group passed",
            lambda *x: mine(*x, group=pg),
            theirs,
            inverse,
            shapes,
            40 + n,
            device,
        )
        compare_usp(
            f"{label} ({name}), xDiT's group", mine, theirs, inverse, shapes, 50 + n, device
        )


def check_patch(pg, P, device):
    usp = usp_module(pg, P)
    theirs = {name: getattr(usp, name) for name in NAMES}
    patched = ours_xfuser.patch_xfuser()
    try:
        for name in NAMES:
            assert f"{USP}.{name}" in patched, f"{name} not rebound: {patched}"
        assert usp._ft_c_input_all_to_all is ours_xfuser.input_all_to_all
        for n, (_, name, shapes, label, reverse) in enumerate(usp_cases(P)):
            compare_usp(
                f"{label} through the USP module after patch_xfuser()",
                lambda *x, name=name: getattr(usp, name)(*x),
                theirs[name],
                theirs[reverse],
                shapes,
                60 + n,
                device,
            )
    finally:
        restored = ours_xfuser.unpatch_xfuser()
    assert sorted(restored) == sorted(patched), (restored, patched)
    for name in NAMES:
        assert getattr(usp, name) is theirs[name], f"unpatch_xfuser left {name} rebound"


def check_fastvideo(pg, P, device):
    comm = upstream.load(
        "fastvideo", "fastvideo.distributed.device_communicators.base_device_communicator"
    )
    communicator = comm.DeviceCommunicatorBase(pg, device=device, device_group=pg)
    for n, (pair, shape) in enumerate((((2, 1), (2, 3, 2 * P, 8)), ((1, 2), (2, 3 * P, 2, 8)))):
        mine = lambda x, pair=pair: ours_fastvideo.all_to_all_4D(x, *pair, group=pg)  # noqa: E731
        compare_many(
            f"all_to_all_4D{pair} against DistributedAutograd.AllToAll4D",
            mine,
            lambda x, pair=pair: comm.DistributedAutograd.AllToAll4D.apply(pg, x, P, *pair),
            [shape],
            70 + n,
            device,
        )
        compare_many(
            f"all_to_all_4D{pair} against DeviceCommunicatorBase.all_to_all_4D",
            mine,
            lambda x, pair=pair: communicator.all_to_all_4D(x, *pair),
            [shape],
            80 + n,
            device,
        )


# framework -> its checks (name, function)
CHECKS = {
    "xfuser": (("xfuser_usp", check_usp), ("xfuser_patch", check_patch)),
    "fastvideo": (("fastvideo", check_fastvideo),),
}


def main() -> int:
    args, frameworks = parse_framework_args(CHECKS)

    def body(report, pg, P, device):
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
