"""One rank of tests/python/test_diffusers_patch.py (gloo CPU ranks) and of
tests/gpu/test_diffusers_gpu.py (--shared-gpu: every rank on cuda:0, the fast group): diffusers'
context parallelism with `fast_ulysses.integrations.diffusers.patch_diffusers()`, on a world of P
ranks (diffusers' mesh spans the whole world, so each P is its own launch).

The model: a real `WanTransformer3DModel` (2 layers, heads of 16, random weights, seeded), in
float32, run on P ranks with `enable_parallelism(config=ContextParallelConfig(ulysses_degree=P))`
and on one process (a copy made before). Every rank computes loss = sum(output * w) on the whole
gathered output. Checks (P >= 2):
- wan_even_P<p>: P | heads, P | tokens. The patched model against diffusers' own context
  parallelism (run first, unpatched) and against one process. Counters: diffusers' own
  all-to-alls ran 16 times unpatched and 0 times patched; ours 0 and 16 (4 per layer forward, 4
  backward); torch's all-to-alls (funcol and c10d) are exactly ours (the fallback group's) or
  none (the fast group's).
- wan_uneven_heads_P<p>: heads P does not divide (3 on 2, 4 on 3, 5 on 4; diffusers' own cannot
  reshape them), the even-sequence path, against one process.
- wan_uneven_seq_P<p>: `ulysses_anything=True`, 7 tokens (P does not divide it) and uneven
  heads, forward and backward (diffusers' own has no backward there), against one process.
- unpatch_P<p>: unpatch_diffusers() restores diffusers' own objects, and its all-to-all runs.
How they compare: against diffusers' own context parallelism (where it runs), the output and
every rank's own parameter gradients must be equal bit for bit. Against one process, to float32
rounding, |a - b| <= 1e-5 * max|b| + 1e-6: the output, because each rank's linear layers see
only its rows and the CPU GEMM may round a row differently with another row count (a
Linear(80, 80) on 12 rows and on 4 x 3 rows differ in the last bit); each parameter's gradient
summed over ranks (all_reduce), because the ranks' shares add the same terms in another order
than the single process's one sum over all tokens.
- attention_P<p> (every P, P = 1 too): the patched attention with a math backend that supports
  masks and `return_lse`: a key-padding mask of each rank's own keys (all-gathered, diffusers'
  rule), the LSE, q of 7 rows and k/v of 9 split unevenly (`ulysses_anything`), uneven heads;
  output, LSE and q/k/v gradients bit for bit against the same math on one process; a per-head
  mask raises FastUlyssesError on every rank.
- unified_P4 (P = 4): ring 2 x Ulysses 2 (`SeqAllToAllDim`): output, LSE and gradients equal to
  diffusers' own unified path bit for bit, and within float32 rounding of one process (ring
  attention merges partial softmaxes); diffusers' own all-to-all ran 0 times patched.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import logging
import os
import sys
import traceback
import types

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from multirank import Report

LAYERS, HEAD_DIM = 2, 16
UNEVEN_HEADS = {2: 3, 3: 4, 4: 5}


def cpu_shims() -> None:
    """diffusers 0.42.1 needs two things a CPU-only host (and a process without transformers)
    lacks, neither on the all-to-all path: enable_parallelism computes rank %
    torch.accelerator.device_count(), which is 0; its sharder calls logger.warning_once, which
    transformers adds to logging.Logger."""
    if torch.accelerator.device_count() == 0:
        torch.accelerator.device_count = lambda: 1
    if not hasattr(logging.Logger, "warning_once"):
        logging.Logger.warning_once = logging.Logger.warning


def gloo_gather_shim() -> None:
    """diffusers' ulysses_anything sharder gathers the output with dist.all_gather of tensors of
    different sizes, which NCCL accepts and gloo refuses: on gloo (these tests), the library's
    padded gather (what patch_diffusers applies, and unpatch removes), here for the whole run,
    unpatched checks included. The sharder's gather, not the attention's all-to-all."""
    from diffusers.hooks import context_parallel

    from fast_ulysses.integrations.diffusers_cpu import _padded_all_gather_anything

    original = context_parallel._all_gather_anything
    context_parallel._all_gather_anything = functools.partial(_padded_all_gather_anything, original)


def gloo_cuda_gather_shim() -> None:
    """Ranks sharing a GPU talk over gloo, whose all_gather_into_tensor crashes the process on
    CUDA tensors (a memmove from device memory): diffusers' output gather (the sharder's
    AllGatherFunction, funcol.all_gather_tensor) runs on CPU copies here, the gathered tensor
    moved back. The sharder's gather, not the attention's all-to-all; on NCCL it needs none."""
    from diffusers.hooks import context_parallel

    def all_gather_tensor(tensor, gather_dim, group):
        gathered = funcol.all_gather_tensor(tensor.cpu(), gather_dim, group)
        return funcol.wait_tensor(gathered).to(tensor.device)

    context_parallel.funcol = types.SimpleNamespace(all_gather_tensor=all_gather_tensor)


def check_names(world: int, shared_gpu: bool = False) -> list[str]:
    names = ["attention"]
    if world >= 2:
        names += ["wan_even", "wan_uneven_heads", "wan_uneven_seq", "unpatch"]
    if world == 4:
        names.append("unified")
    return [f"{n}_P{world}" for n in names]


# -- counters ----------------------------------------------------------------------------------


class Counters:
    """Calls of diffusers' own all-to-alls, of torch's, and of our group's, since reset()."""

    DIFFUSERS = (
        "_all_to_all_single",
        "all_to_all_single_any_qkv_async",
        "all_to_all_single_any_o_async",
    )

    def __init__(self, dispatch, group):
        self.counts = {}
        for name in self.DIFFUSERS:
            self._wrap(dispatch, name, "diffusers")
        self._wrap(funcol, "all_to_all_single", "torch")
        self._wrap(dist, "all_to_all_single", "torch")
        self._wrap(group, "all_to_all_single_4d", "ours")

    def _wrap(self, owner, name, key):
        inner = getattr(owner, name)

        def counted(*args, **kwargs):
            self.counts[key] = self.counts.get(key, 0) + 1
            return inner(*args, **kwargs)

        setattr(owner, name, counted)

    def reset(self) -> dict:
        seen, self.counts = dict(self.counts), {}
        return {k: seen.get(k, 0) for k in ("diffusers", "torch", "ours")}


# -- the model ---------------------------------------------------------------------------------


def tiny_wan(heads: int, device):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=heads,
        attention_head_dim=HEAD_DIM,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=LAYERS,
        rope_max_seq_len=64,
    ).to(device)


def wan_inputs(frames, height, width, device):
    """Latents giving frames * height/2 * width/2 tokens, a timestep, 5 text tokens and the
    loss weights; the same on every rank."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, frames, height, width, generator=g)
    text = torch.randn(1, 5, 32, generator=g)
    w = torch.randn(1, 4, frames, height, width, generator=g)
    return [t.to(device) for t in (x, torch.tensor([500.0]), text, w)]


def run_wan(model, inputs):
    x, t, text, w = inputs
    model.zero_grad(set_to_none=True)
    out = model(x, t, text, return_dict=False)[0]
    (out * w).sum().backward()
    return out.detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


def parallel_wan(model, P, mesh, anything):
    from diffusers import ContextParallelConfig

    model.enable_parallelism(
        config=ContextParallelConfig(ulysses_degree=P, ulysses_anything=anything, mesh=mesh)
    )
    return model


def assert_equal(name, got, want):
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    if not torch.equal(got, want):
        diff = (got.double() - want.double()).abs().max().item()
        raise AssertionError(f"{name}: not bit-equal (max |diff| {diff:.3e})")


def assert_summed_grads(grads, want, what):
    """Every parameter's gradient, summed over ranks, within float32 rounding of `want`."""
    assert sorted(grads) == sorted(want), (
        f"{what}: gradients of {sorted(set(grads) ^ set(want))} on one side only"
    )
    worst = 0.0
    for name in sorted(want):
        total = grads[name].clone()
        dist.all_reduce(total)
        scale = want[name].abs().max().item()
        diff = (total - want[name]).abs().max().item()
        assert diff <= 1e-5 * scale + 1e-6, (
            f"{what}: parameter {name}: max |diff| {diff:.3e} against max |grad| {scale:.3e}"
        )
        worst = max(worst, diff / (scale or 1.0))
    return worst


def check_wan(P, device, mesh, counters, heads, shape, anything, versus_diffusers):
    from fast_ulysses.integrations import diffusers as ours

    model = tiny_wan(heads, device)
    inputs = wan_inputs(*shape, device)
    want_out, want_grads = run_wan(copy.deepcopy(model), inputs)
    detail = []
    if versus_diffusers:
        ours.unpatch_diffusers()
        counters.reset()
        own_out, own_grads = run_wan(parallel_wan(copy.deepcopy(model), P, mesh, anything), inputs)
        seen = counters.reset()
        assert seen["diffusers"] == 8 * LAYERS and seen["ours"] == 0, (
            f"unpatched, all-to-alls counted {seen}: want diffusers' {8 * LAYERS}, ours 0"
        )
    ours.patch_diffusers()
    counters.reset()
    out, grads = run_wan(parallel_wan(model, P, mesh, anything), inputs)
    seen = counters.reset()
    group = fast_group_of(mesh)
    torch_calls = 0 if not getattr(group, "fallback", True) else seen["ours"]
    assert seen == {"diffusers": 0, "ours": 8 * LAYERS, "torch": torch_calls}, (
        f"patched, all-to-alls counted {seen}: want diffusers' 0, ours {8 * LAYERS}, torch's "
        f"{torch_calls}"
    )
    out_diff = (out - want_out).abs().max().item()
    bound = 1e-5 * want_out.abs().max().item() + 1e-6
    assert out_diff <= bound, f"output against one process: max |diff| {out_diff:.3e} > {bound:.3e}"
    if versus_diffusers:
        assert_equal("output against diffusers' own", out, own_out)
        for name in sorted(own_grads):
            assert_equal(
                f"this rank's gradient of {name} against diffusers' own",
                grads[name],
                own_grads[name],
            )
    worst = assert_summed_grads(grads, want_grads, "against one process")
    detail.append(
        f"{heads} heads, latents {shape}, counts {seen}, output max |diff| "
        f"{out_diff:.1e}, worst grad rel {worst:.1e}"
    )
    return "; ".join(detail)


def fast_group_of(mesh):
    from fast_ulysses.attention import group_for

    return group_for(mesh["ulysses"].get_group())


# -- the attention alone: masks, LSE, uneven lengths -------------------------------------------


def math_attention(q, k, v, mask):
    """Attention and its LSE on (B, S, H, D) in diffusers' model layout; mask bool or None.
    One head at a time on contiguous copies, so a head's result does not depend on which other
    heads share the call (a batched matmul may round differently with another head count)."""
    outs, lses = [], []
    for h in range(q.shape[2]):
        qh, kh, vh = (t[:, :, h].contiguous() for t in (q, k, v))
        s = qh @ kh.transpose(-1, -2) * q.shape[-1] ** -0.5
        if mask is not None:
            s = s.masked_fill(~mask[:, 0], float("-inf"))
        lse = s.logsumexp(-1)
        outs.append((s - lse[..., None]).exp() @ vh)
        lses.append(lse)
    return torch.stack(outs, 2), torch.stack(lses, 2)


def math_forward_op(
    ctx,
    q,
    k,
    v,
    attn_mask,
    dropout_p,
    is_causal,
    scale,
    enable_gqa,
    return_lse,
    _save_ctx=True,
    _parallel_config=None,
):
    if _save_ctx:
        ctx.save_for_backward(q, k, v)
        ctx.math_mask = attn_mask
    out, lse = math_attention(q, k, v, attn_mask)
    return (out, lse) if return_lse else out


def math_backward_op(ctx, grad_out, *args, query=None, key=None, value=None, out=None, lse=None):
    """q, k, v gradients of `math_attention`. Ring attention passes each step's k and v and the
    merged output and LSE; the gradients then follow from those (the flash backward)."""
    q, k, v = ctx.saved_tensors
    q, k, v = (
        q if query is None else query,
        k if key is None else key,
        v if value is None else value,
    )
    if out is None:
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():
            o, _ = math_attention(q, k, v, ctx.math_mask)
        return torch.autograd.grad(o, (q, k, v), grad_out)
    scale = q.shape[-1] ** -0.5
    grads = [[], [], []]
    for h in range(q.shape[2]):
        qh, kh, vh, oh, gh = (t[:, :, h].contiguous() for t in (q, k, v, out, grad_out))
        p = ((qh @ kh.transpose(-1, -2)) * scale - lse[:, :, h, None]).exp()
        ds = p * (gh @ vh.transpose(-1, -2) - (gh * oh).sum(-1, keepdim=True))
        for i, g in enumerate(
            (ds @ kh * scale, ds.transpose(-1, -2) @ qh * scale, p.transpose(-1, -2) @ gh)
        ):
            grads[i].append(g)
    return tuple(torch.stack(g, 2) for g in grads)


def stub_config(pg, P, anything):
    cp = types.SimpleNamespace(
        ring_degree=1,
        ulysses_degree=P,
        ulysses_anything=anything,
        _ulysses_mesh=types.SimpleNamespace(get_group=lambda: pg),
    )
    return types.SimpleNamespace(context_parallel_config=cp)


def attention_case(rank, P, heads, device):
    """Whole q (7 rows), k and v (9 rows), a key-padding mask, loss weights; this rank's rows."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, n, heads, 8, generator=g) for n in (7, 9, 9))
    keep = torch.rand(2, 1, 1, 9, generator=g) > 0.3
    keep[..., 0] = True  # every query sees a key
    w = torch.randn(2, 7, heads, 8, generator=g)
    rows_q = torch.arange(7).tensor_split(P)[rank]
    rows_k = torch.arange(9).tensor_split(P)[rank]
    return [t.to(device) for t in (q, k, v, keep, w)], rows_q, rows_k


def check_attention(pg, P, device):
    from diffusers.models import attention_dispatch as dispatch

    from fast_ulysses.errors import FastUlyssesError
    from fast_ulysses.integrations import diffusers as ours

    ours.patch_diffusers()
    rank, heads = dist.get_rank(pg), UNEVEN_HEADS.get(P, 3)
    (q, k, v, keep, w), rows_q, rows_k = attention_case(rank, P, heads, device)
    full = [t.clone().requires_grad_(True) for t in (q, k, v)]
    want_out, want_lse = math_attention(*full, keep)
    (want_out * w).sum().backward()
    local = [
        t[:, rows].detach().clone().requires_grad_(True)
        for t, rows in ((q, rows_q), (k, rows_k), (v, rows_k))
    ]
    config = stub_config(pg, P, True)
    args = (
        keep[..., rows_k],
        0.0,
        False,
        None,
        False,
        True,
        math_forward_op,
        math_backward_op,
        config,
    )
    # P = 1: diffusers' dispatcher runs no context parallelism, so call the class itself.
    entry = dispatch.TemplatedUlyssesAnythingAttention
    assert entry is ours.TemplatedUlyssesAnythingAttention, "patch_diffusers did not rebind it"
    if P > 1:
        out, lse = dispatch._templated_context_parallel_attention(
            *local,
            *args[:6],
            forward_op=math_forward_op,
            backward_op=math_backward_op,
            _parallel_config=config,
        )
    else:
        out, lse = entry.apply(*local, *args)
    (out * w[:, rows_q]).sum().backward()
    assert_equal("output", out, want_out[:, rows_q].detach())
    assert_equal("lse", lse, want_lse[:, rows_q].detach())
    for name, t, f, rows in zip("qkv", local, full, (rows_q, rows_k, rows_k)):
        assert_equal(f"{name}.grad", t.grad, f.grad[:, rows])
    if P > 1:  # a per-head mask: refused on every rank before anything is sent
        per_head = torch.ones(2, heads, 1, 9, dtype=torch.bool, device=device)
        try:
            entry.apply(*local, per_head, *args[1:])
        except FastUlyssesError as error:
            assert "attn_mask has shape" in str(error), str(error)
        else:
            raise AssertionError("a per-head mask was accepted")
    return f"{heads} heads, q rows {rows_q.tolist()}, k rows {rows_k.tolist()}"


def check_unified(device, counters):
    """Ring 2 x Ulysses 2 through diffusers' dispatcher with the math backend (ring attention
    needs an LSE): ours against diffusers' own, and against one process."""
    from diffusers import ContextParallelConfig, ParallelConfig
    from diffusers.models import attention_dispatch as dispatch
    from torch.distributed.device_mesh import init_device_mesh

    from fast_ulysses.integrations import diffusers as ours

    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("ring", "ulysses"))
    config = ParallelConfig(
        context_parallel_config=ContextParallelConfig(ring_degree=2, ulysses_degree=2, mesh=mesh)
    )
    config.setup(dist.get_rank(), 4, device, mesh=mesh)
    from fast_ulysses.attention import group_for

    counters._wrap(group_for(mesh["ulysses"].get_group()), "all_to_all_single_4d", "ours")
    g = torch.Generator().manual_seed(11)
    q, k, v, w = (torch.randn(1, 8, 4, 8, generator=g).to(device) for _ in range(4))
    rows = torch.arange(8).chunk(4)[config.context_parallel_config._flattened_mesh.get_local_rank()]

    def run():
        local = [t[:, rows].clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = dispatch._templated_context_parallel_attention(
            *local,
            None,
            0.0,
            False,
            None,
            False,
            True,
            forward_op=math_forward_op,
            backward_op=math_backward_op,
            _parallel_config=config,
        )
        (out * w[:, rows]).sum().backward()
        return [out.detach(), lse.detach()] + [t.grad for t in local]

    ours.unpatch_diffusers()
    counters.reset()
    own = run()
    seen_own = counters.reset()
    ours.patch_diffusers()
    counters.reset()
    got = run()
    seen = counters.reset()
    assert seen_own["diffusers"] > 0 and seen_own["ours"] == 0, f"unpatched: {seen_own}"
    assert seen["diffusers"] == 0 and seen["ours"] == 9, (
        f"patched, all-to-alls counted {seen}: want diffusers' 0, ours 9 (q, k, v, output, "
        "LSE; 4 in backward)"
    )
    names = ("output", "lse", "q.grad", "k.grad", "v.grad")
    for name, a, b in zip(names, got, own):
        assert_equal(f"{name} against diffusers' own", a, b)
    full = [t.clone().requires_grad_(True) for t in (q, k, v)]
    want_out, want_lse = math_attention(*full, None)
    (want_out * w).sum().backward()
    want = [want_out[:, rows], want_lse[:, rows]] + [f.grad[:, rows] for f in full]
    for name, a, b in zip(names, got, want):
        torch.testing.assert_close(
            a, b.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{name} against one process: {m}"
        )
    return f"counts unpatched {seen_own}, patched {seen}"


# -- main --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="every rank on cuda:0 (make_group picks the fast group)",
    )
    args = parser.parse_args()
    cpu_shims()
    # diffusers' size gather (ulysses_anything's sharder) uses the CPU only where the backend
    # string names it.
    backend = "cpu:gloo,cuda:gloo" if args.shared_gpu else "cpu:gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    if args.shared_gpu:
        torch.cuda.set_device(0)
    device = torch.device("cuda", 0) if args.shared_gpu else torch.device("cpu")
    rank, P = dist.get_rank(), dist.get_world_size()
    report = Report(rank)
    try:
        run_checks(report, P, device)
    except Exception:  # noqa: BLE001 - report everything, then fail this rank
        traceback.print_exc()
        sys.stdout.flush()
        return 1
    report.finish()
    dist.destroy_process_group()
    return 0


def run_checks(report, P, device):
    from diffusers.models import attention_dispatch as dispatch
    from torch.distributed.device_mesh import init_device_mesh

    from fast_ulysses.attention import group_for
    from fast_ulysses.integrations import diffusers as ours

    gloo_gather_shim()
    if device.type == "cuda":
        gloo_cuda_gather_shim()
    # One Ulysses process group for every check (P = 1: the world; diffusers needs P >= 2).
    mesh = (
        init_device_mesh(device.type, (1, P), mesh_dim_names=("ring", "ulysses")) if P > 1 else None
    )
    pg = mesh["ulysses"].get_group() if mesh is not None else dist.group.WORLD
    with report.check(f"attention_P{P}") as entry:
        entry["detail"] = check_attention(pg, P, device)
    if P < 2:
        group_for(pg).destroy()  # collective
        return
    counters = Counters(dispatch, group_for(pg))
    even_heads = 4 if 4 % P == 0 else P
    cases = (
        ("wan_even", even_heads, (3, 4, 4), False, True),
        ("wan_uneven_heads", UNEVEN_HEADS[P], (3, 4, 4), False, False),
        ("wan_uneven_seq", UNEVEN_HEADS[P], (1, 14, 2), True, False),
    )
    for name, heads, shape, anything, versus in cases:
        with report.check(f"{name}_P{P}") as entry:
            entry["detail"] = check_wan(P, device, mesh, counters, heads, shape, anything, versus)
    with report.check(f"unpatch_P{P}"):
        restored = ours.unpatch_diffusers()
        assert restored, "unpatch_diffusers restored nothing after patch_diffusers"
        assert dispatch.TemplatedUlyssesAttention is not ours.TemplatedUlyssesAttention
        assert dispatch.SeqAllToAllDim.__module__ == dispatch.__name__
        counters.reset()
        run_wan(
            parallel_wan(tiny_wan(even_heads, device), P, mesh, False), wan_inputs(3, 4, 4, device)
        )
        seen = counters.reset()
        assert seen["diffusers"] == 8 * LAYERS and seen["ours"] == 0, f"unpatched: {seen}"
    if P == 4:
        with report.check(f"unified_P{P}") as entry:
            entry["detail"] = check_unified(device, counters)
    group_for(pg).destroy()  # collective


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
