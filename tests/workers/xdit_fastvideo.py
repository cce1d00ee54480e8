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
  get_ulysses_parallel_world_size are set to this group (the only stand-ins). Every forward
  makes as many calls of our group as xDiT makes collectives (its _sdpa_all_to_all_single,
  counted): one for each combined q/k/v (plain and GQA, with an extra tensor, GQA with a longer
  kv sequence, q/k/v given as transposed (b, s, h, d) views).
- xfuser_patch_P<p>: patch_xfuser() rebinds the four in the USP module (so USP(), and xDiT's FP8
  path, which looks them up there at call time, use ours), the results equal xDiT's own with
  the same call counts, and unpatch_xfuser() restores xDiT's.
- fastvideo_P<p>: fast_ulysses.integrations.fastvideo.all_to_all_4D, (2, 1) and (1, 2), against
  fastvideo.distributed.device_communicators.base_device_communicator's
  DistributedAutograd.AllToAll4D and DeviceCommunicatorBase(group).all_to_all_4D (what
  FastVideo's sequence_model_parallel_all_to_all_4D runs on CPU, and on GPU where its fused
  helper declines).
- fastvideo_patch_P<p>: FastVideo's own path (communication_op's
  sequence_model_parallel_all_to_all_4D -> parallel_state.get_sp_group() ->
  GroupCoordinator.all_to_all_4D) unpatched, after
  patch_fastvideo() and after unpatch_fastvideo(): (2, 1), (1, 2) and its attention layer's
  q/k/v concatenated along the batch (one call), forward and gradients bit for bit against
  FastVideo's own; patched, every call makes one call of our group and FastVideo's
  AllToAll4D runs 0 times (forward or backward; counted), unpatched it runs again. The
  coordinator is the one initialize_model_parallel builds for this group, its attributes set as
  its __init__ sets them (the constructor needs fastvideo.platforms.current_platform, and
  new_group on every rank of the world), with FastVideo's DeviceCommunicatorBase.
Every rank's input is different, so a chunk sent to the wrong rank shows.
"""

from __future__ import annotations

import contextlib
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
from fast_ulysses.errors import FastUlyssesError
from fast_ulysses.integrations import fastvideo as ours_fastvideo
from fast_ulysses.integrations import xfuser as ours_xfuser

USP = "xfuser.model_executor.layers.usp"
COMM = "fastvideo.distributed.device_communicators.base_device_communicator"
STATE = "fastvideo.distributed.parallel_state"
OP = "fastvideo.distributed.communication_op"
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


@contextlib.contextmanager
def counting(owner, name):
    """Counts the calls of `owner.<name>` (a module's function, or an object's method: wrapped
    on that object only) made in the block; yields a list, one entry per call."""
    had, saved = name in vars(owner), vars(owner).get(name)
    original, calls = getattr(owner, name), []

    def counted(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    setattr(owner, name, counted)
    try:
        yield calls
    finally:
        if had:
            setattr(owner, name, saved)
        else:
            delattr(owner, name)


def compare_usp(label, f_ours, f_theirs, inverse, shapes, seed, device, pg, usp, transpose=False):
    """Outputs bit for bit against xDiT's; each input's gradient against `inverse` (xDiT's
    reverse all-to-all) of the weight its output got; our forward makes as many calls of the
    group as xDiT's makes collectives (`_sdpa_all_to_all_single`). transpose: the inputs are
    made (b, s, h, d) and passed as (b, h, s, d) views, as xDiT's models pass them."""
    xs = rank_inputs(shapes, seed, device)
    leaves = [x.clone().requires_grad_() for x in xs]
    view = (lambda t: t.transpose(1, 2)) if transpose else (lambda t: t)
    with counting(group_for(pg), "all_to_all_single_4d") as ours:
        got = f_ours(*(view(t) for t in leaves))
    with counting(usp, "_sdpa_all_to_all_single") as theirs:
        want = f_theirs(*(view(t) for t in xs))
    got, want = (t if isinstance(t, tuple) else (t,) for t in (got, want))
    assert len(got) == len(want), f"{label}: {len(got)} outputs, xDiT's {len(want)}"
    assert len(ours) == len(theirs), (
        f"{label}: {len(ours)} calls of our group, xDiT makes {len(theirs)} all-to-alls"
    )
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, generator=g).to(device) for o in got]
    for i, (a, b) in enumerate(zip(got, want)):
        assert adapters.same_bits(a.detach(), b), f"{label}: output {i} differs from xDiT's"
    sum((o * w).sum() for o, w in zip(got, weights)).backward()
    for i, (leaf, w) in enumerate(zip(leaves, weights)):
        assert adapters.same_bits(leaf.grad, view(inverse(w))), (
            f"{label}: input {i}'s gradient differs from xDiT's reverse all-to-all"
        )
    return len(ours)


def usp_module(pg, P):
    usp = upstream.load("xfuser", USP)
    # xDiT's parallel state, as initialize_model_parallel would set it for this group.
    usp.PROCESS_GROUP = types.SimpleNamespace(ULYSSES_PG=pg)
    usp.get_ulysses_parallel_world_size = lambda: P
    return usp


def usp_cases(P):
    """(our function, xDiT's name, input shapes, label, xDiT's reverse, transpose, xDiT's
    collectives at P > 1): shapes (b, h, s, d), or (b, s, h, d) with transpose."""
    seq_in, head_in = (2, 2 * P, 3, 8), (2, 2, 3 * P, 8)
    q_gqa, kv_gqa = (2, 4 * P, 3, 8), (2, 2 * P, 3, 8)
    combined, gqa = ours_xfuser.combined_qkv_all_to_all, ours_xfuser.combined_gqa_qkv_all_to_all
    return [
        (ours_xfuser.input_all_to_all, NAMES[0], [seq_in], "input", NAMES[1], False, 1),
        (ours_xfuser.output_all_to_all, NAMES[1], [head_in], "output", NAMES[0], False, 1),
        (combined, NAMES[2], [seq_in] * 3, "combined qkv", NAMES[1], False, 1),
        (combined, NAMES[2], [seq_in] * 4, "combined qkv + 1", NAMES[1], False, 1),
        (
            combined,
            NAMES[2],
            [(1, 3, 2 * P, 8)] * 3,
            "combined qkv, b = 1, (b, s, h, d) views",
            NAMES[1],
            True,
            1,
        ),
        (gqa, NAMES[3], [q_gqa, kv_gqa, kv_gqa], "combined GQA qkv", NAMES[1], False, 1),
        (
            gqa,
            NAMES[3],
            [q_gqa, kv_gqa, kv_gqa, q_gqa],
            "combined GQA qkv + 1",
            NAMES[1],
            False,
            1,
        ),
        (
            gqa,
            NAMES[3],
            [q_gqa, (2, P, 5, 8), (2, P, 5, 8)],
            "combined GQA qkv, longer kv sequence",
            NAMES[1],
            False,
            1,
        ),
        (
            gqa,
            NAMES[3],
            [(2, 3, 4 * P, 8), (2, 3, 2 * P, 8), (2, 3, 2 * P, 8)],
            "combined GQA qkv, (b, s, h, d) views",
            NAMES[1],
            True,
            1,
        ),
    ]


def check_usp(pg, P, device):
    usp = usp_module(pg, P)
    for n, (mine, name, shapes, label, reverse, transpose, calls) in enumerate(usp_cases(P)):
        theirs, inverse = getattr(usp, name), getattr(usp, reverse)
        for passed, seed in ((True, 40 + n), (False, 50 + n)):
            made = compare_usp(
                f"{label} ({name}), {'group passed' if passed else 'xDiT group'}",
                (lambda *x, mine=mine: mine(*x, group=pg)) if passed else mine,
                theirs,
                inverse,
                shapes,
                seed,
                device,
                pg,
                usp,
                transpose,
            )
            assert made == (calls if P > 1 else 0), f"{label}: {made} calls of our group"


def check_patch(pg, P, device):
    usp = usp_module(pg, P)
    theirs = {name: getattr(usp, name) for name in NAMES}
    patched = ours_xfuser.patch_xfuser()
    try:
        for name in NAMES:
            assert f"{USP}.{name}" in patched, f"{name} not rebound: {patched}"
        assert usp._ft_c_input_all_to_all is ours_xfuser.input_all_to_all
        for n, (_, name, shapes, label, reverse, transpose, calls) in enumerate(usp_cases(P)):
            made = compare_usp(
                f"{label} through the USP module after patch_xfuser()",
                lambda *x, name=name: getattr(usp, name)(*x),
                theirs[name],
                theirs[reverse],
                shapes,
                60 + n,
                device,
                pg,
                usp,
                transpose,
            )
            assert made == (calls if P > 1 else 0), f"{label}: {made} calls of our group"
    finally:
        restored = ours_xfuser.unpatch_xfuser()
    assert sorted(restored) == sorted(patched), (restored, patched)
    for name in NAMES:
        assert getattr(usp, name) is theirs[name], f"unpatch_xfuser left {name} rebound"


def check_fastvideo(pg, P, device):
    comm = upstream.load("fastvideo", COMM)
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


def sp_coordinator(state, comm, pg, P, device):
    """The GroupCoordinator FastVideo's initialize_model_parallel builds for `pg` (its "sp"
    group), with the attributes its __init__ sets and FastVideo's DeviceCommunicatorBase (what
    its CPU communicator inherits for the all-to-all); see the module docstring."""
    coordinator = object.__new__(state.GroupCoordinator)
    coordinator.unique_name = "sp:0"
    coordinator.rank = coordinator.local_rank = dist.get_rank()
    coordinator.ranks = dist.get_process_group_ranks(pg)
    coordinator.world_size, coordinator.rank_in_group = P, dist.get_rank(pg)
    coordinator.device_group = coordinator.cpu_group = pg
    coordinator.device = device
    coordinator.use_device_communicator = True
    coordinator.device_communicator = None  # as __init__ leaves it at P = 1
    if P > 1:
        coordinator.device_communicator = comm.DeviceCommunicatorBase(
            pg, device=device, device_group=pg, unique_name="sp:0"
        )
    coordinator.mq_broadcaster = None
    coordinator.use_custom_op_call = False
    return coordinator


def run_path(f, shapes, seed, device, pg, comm):
    """f(*inputs), forward and backward: (outputs, input gradients, calls of our group in the
    forward, runs of FastVideo's AllToAll4D in forward and backward)."""
    xs = rank_inputs(shapes, seed, device)
    leaves = [x.clone().requires_grad_() for x in xs]
    with counting(comm.DistributedAutograd.AllToAll4D, "forward") as theirs:
        with counting(group_for(pg), "all_to_all_single_4d") as ours:
            out = f(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        g = torch.Generator().manual_seed(seed)
        sum((o * torch.randn(o.shape, generator=g).to(device)).sum() for o in outs).backward()
    return [o.detach() for o in outs], [x.grad for x in leaves], len(ours), len(theirs)


def fastvideo_cases(a2a, P):
    """(label, f, input shapes, FastVideo's all-to-alls in f) through its own path `a2a`."""

    def layer(q, k, v):  # FastVideo's DistributedAttention: one call for q, k, v, one for o
        qkv = a2a(torch.cat([q, k, v], dim=0), scatter_dim=2, gather_dim=1)
        q, k, v = qkv.chunk(3, dim=0)
        return a2a(q * k + v, scatter_dim=1, gather_dim=2)

    return [
        ("(2, 1)", lambda x: a2a(x, 2, 1), [(2, 3, 2 * P, 8)], 1),
        ("(1, 2)", lambda x: a2a(x, 1, 2), [(2, 3 * P, 2, 8)], 1),
        ("q/k/v concatenated along the batch, then the output", layer, [(2, 3, 2 * P, 8)] * 3, 2),
    ]


def check_fastvideo_patch(pg, P, device):
    comm, state = upstream.load("fastvideo", COMM), upstream.load("fastvideo", STATE)
    a2a = upstream.load("fastvideo", OP).sequence_model_parallel_all_to_all_4D
    own = state.GroupCoordinator.all_to_all_4D
    name = f"{STATE}.GroupCoordinator.all_to_all_4D"
    saved, state._SP = state._SP, sp_coordinator(state, comm, pg, P, device)
    try:
        for n, (label, f, shapes, calls) in enumerate(fastvideo_cases(a2a, P)):
            calls = calls if P > 1 else 0
            want = run_path(f, shapes, 90 + n, device, pg, comm)
            assert want[2:] == (0, 2 * calls), (
                f"{label}, unpatched: calls (ours, FastVideo's) {want[2:]}"
            )
            patched = ours_fastvideo.patch_fastvideo()
            try:
                assert patched == [name], patched
                assert ours_fastvideo.patch_fastvideo() == patched  # again: changes nothing
                got = run_path(f, shapes, 90 + n, device, pg, comm)
                # A bad tensor is refused at every P (on every rank, before anything is sent).
                try:
                    a2a(torch.zeros(2, 3, 2 * P, device=device), 2, 1)
                except FastUlyssesError as error:
                    assert "input_ has shape" in str(error), error
                else:
                    raise AssertionError("a 3-d input was not refused")
            finally:
                restored = ours_fastvideo.unpatch_fastvideo()
            assert restored == [name] and ours_fastvideo.unpatch_fastvideo() == [], restored
            assert state.GroupCoordinator.all_to_all_4D is own, "unpatch_fastvideo left it rebound"
            assert got[2:] == (calls, 0), (
                f"{label}, patched: calls (ours, FastVideo's) {got[2:]}, want ({calls}, 0)"
            )
            for kind, i in (("output", 0), ("gradient", 1)):
                for j, (a, b) in enumerate(zip(got[i], want[i])):
                    assert adapters.same_bits(a, b), f"{label}: {kind} {j} differs from FastVideo's"
            again = run_path(f, shapes, 90 + n, device, pg, comm)
            assert again[2:] == (0, 2 * calls), f"{label}, unpatched again: {again[2:]}"
    finally:
        state._SP = saved


# framework -> its checks (name, function)
CHECKS = {
    "xfuser": (("xfuser_usp", check_usp), ("xfuser_patch", check_patch)),
    "fastvideo": (("fastvideo", check_fastvideo), ("fastvideo_patch", check_fastvideo_patch)),
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
