"""One rank of tests/python/test_usp_frameworks.py (4 gloo CPU ranks) and of
tests/gpu/test_usp_frameworks_gpu.py (--shared-gpu: every rank on cuda:0, ours on the fast
group): the frameworks' own Ulysses x Ring (USP) attention, ring 2 x Ulysses 2, Ulysses ranks
contiguous ({0, 1}, {2, 3}; the rings {0, 2}, {1, 3}), with fast-ulysses' patch. Rank r holds
chunk r of the sequence. Each check runs the framework unpatched, then patched (the rebinding
undone after), and compares:
- diffusers_usp_P4: a real 2-layer WanTransformer3DModel under
  `enable_parallelism(ContextParallelConfig(ring_degree=2, ulysses_degree=2))` with diffusers'
  `_native_flash` backend (its ring needs the LSE), forward and backward: output and this
  rank's parameter gradients bit for bit against diffusers' own run, within float32 rounding of
  one process; diffusers' own all-to-all ran 16 times unpatched and 0 patched, our group 0 and
  16 (q, k, v, output per layer, forward and backward), diffusers' ring (funcol all_gather /
  permute on the ring group) the same number of times in both runs.
- yunchang_usp_P4: yunchang's `LongContextAttention` (`yunchang.hybrid`) with its torch ring
  (`ring_impl_type="basic_pytorch"`, `AttnType.TORCH_FLASH`), groups from
  `set_seq_parallel_pg(2, 2, ...)`, after `patch_yunchang()`: forward bit for bit against
  yunchang's own, within float32 rounding of one process's attention; yunchang's all-to-all
  (dist.all_to_all_single) 4 times unpatched, ours 4 patched (q, k, v, output), the ring's
  batch_isend_irecv the same in both runs. Forward only: yunchang's torch attention has no
  backward (`pytorch_attn_backward` raises).
- xfuser_usp_P4: xDiT's `USP()` (xfuser.model_executor.layers.usp; the ring is torch's
  `_templated_ring_attention` on the ring group) with backend `SDPA_FLASH`, after
  `patch_xfuser()`, separate and combined q/k/v exchanges, and GQA (k, v with half q's heads,
  `kv_head_repeat=2`, combined): forward bit for bit against xDiT's own, within float32
  rounding of one process; xDiT's `_sdpa_all_to_all_single` 4 (2 combined) times unpatched,
  ours 4 (2) patched. Forward only (xDiT is an inference engine). Stand-ins:
  USP's parallel-state getters (world sizes, runtime state with FP8 comms and head balance
  off), as `initialize_model_parallel` would fill them; its groups are yunchang's
  PROCESS_GROUP, which it reads. With --shared-gpu only (xDiT defines it only where CUDA is
  available, and its package does CUDA work on import): `xFuserLongContextAttention`
  (AttnType.TORCH_FLASH) the same way, yunchang's all-to-all 4 times unpatched, ours 4 patched.
With --shared-gpu the ranks talk over gloo (NCCL hangs with two ranks on one GPU), which
crashes on CUDA tensors in all_gather, permute and P2P: the rings' collectives (and diffusers'
output gather) go through host copies there (usp_standins.py).
Inputs are float32 on CPU, bfloat16 on the GPU (its flash kernels take no float32; one-process
tolerances follow the dtype, and the Wan gradients are compared with diffusers' own only).
On CPU ranks, torch's `aten::_scaled_dot_product_flash_attention` and its backward (CUDA-only
kernels, which diffusers' `_native_flash`, yunchang's TORCH_FLASH and xDiT's SDPA_FLASH call)
get a CPU kernel: torch's CPU flash attention (`_scaled_dot_product_flash_attention_for_cpu`
and its backward), which returns the LSE the rings merge by. Nothing else of the frameworks is
replaced; with --shared-gpu their real CUDA kernels run.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import sys
import traceback
import types

import diffusers_patch as wan
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
import usp_standins as standins
from multirank import Report

from fast_ulysses.attention import group_for

WORLD, RING, ULYSSES = 4, 2, 2
FRAMEWORKS = ("diffusers", "yunchang", "xfuser")


def check_names(frameworks=FRAMEWORKS) -> list[str]:
    return [f"{f}_usp_P{WORLD}" for f in frameworks]


def missing(framework: str) -> str:
    """Why `framework`'s check cannot run here ("" when it can): the skip reason. xDiT's also
    needs yunchang, whose process groups its USP reads."""
    import importlib.util

    import upstream_nodeps

    for package in ("diffusers",) if framework == "diffusers" else ("yunchang",):
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed (requirements/dev.txt)"
    return upstream_nodeps.missing("xfuser") if framework == "xfuser" else ""


# -- counting calls ----------------------------------------------------------------------------


class Counted:
    """Calls of named callables since reset(); `wrap` replaces owner.name by a counting one."""

    def __init__(self):
        self.counts, self._undo = {}, []

    def wrap(self, owner, name: str, key: str) -> None:
        inner = getattr(owner, name)

        def counted(*args, **kwargs):
            self.counts[key] = self.counts.get(key, 0) + 1
            return inner(*args, **kwargs)

        self._undo.append((owner, name, inner))
        setattr(owner, name, counted)

    def reset(self) -> dict:
        seen, self.counts = self.counts, {}
        return seen

    def unwrap(self) -> None:
        while self._undo:
            owner, name, inner = self._undo.pop()
            setattr(owner, name, inner)


def dtype_of(device) -> torch.dtype:
    """float32 on CPU; bfloat16 on a GPU, whose flash kernels take no float32."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def close(name: str, got, want) -> float:
    """|got - want| <= r * max|want| + 1e-6, r the rounding of got's dtype (float32: 1e-5,
    bfloat16: 2e-2); returns max |diff|."""
    rel = 1e-5 if got.dtype == torch.float32 else 2e-2
    diff = (got.float() - want.float()).abs().max().item()
    bound = rel * want.float().abs().max().item() + 1e-6
    assert diff <= bound, f"{name} against one process: max |diff| {diff:.3e} > {bound:.3e}"
    return diff


def qkv_case(device, heads=4, seq=16, dim=8):
    """Whole q, k, v (1, seq, heads, dim), the same on every rank; this rank's rows."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (
        torch.randn(1, seq, heads, dim, generator=g).to(device, dtype_of(device)) for _ in range(3)
    )
    rows = torch.arange(seq).chunk(WORLD)[dist.get_rank()]
    return (q, k, v), rows


def one_process(q, k, v):
    """Attention over the whole sequence, (b, s, h, d), in float32."""
    q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2)


# -- diffusers ---------------------------------------------------------------------------------


def check_diffusers(device) -> str:
    from diffusers import ContextParallelConfig
    from diffusers.models import attention_dispatch as dispatch
    from torch.distributed.device_mesh import init_device_mesh

    from fast_ulysses.integrations import diffusers as ours

    mesh = init_device_mesh(device.type, (RING, ULYSSES), mesh_dim_names=("ring", "ulysses"))
    group = group_for(mesh["ulysses"].get_group())
    counters = wan.Counters(dispatch, group)
    counters._wrap(funcol, "all_gather_tensor", "ring")
    counters._wrap(funcol, "permute_tensor", "ring")
    dtype = dtype_of(device)
    model = wan.tiny_wan(4, device).to(dtype)
    inputs = [t.to(dtype) for t in wan.wan_inputs(3, 4, 4, device)]
    want_out, want_grads = wan.run_wan(copy.deepcopy(model), inputs)

    def run():
        parallel = copy.deepcopy(model)
        parallel.set_attention_backend("_native_flash")
        config = ContextParallelConfig(ring_degree=RING, ulysses_degree=ULYSSES, mesh=mesh)
        parallel.enable_parallelism(config=config)
        counters.counts = {}
        result = wan.run_wan(parallel, inputs)
        return result, dict(counters.counts)

    ours.unpatch_diffusers()
    (own_out, own_grads), seen_own = run()
    ours.patch_diffusers()
    try:
        (out, grads), seen = run()
    finally:
        ours.unpatch_diffusers()
    layers = 8 * wan.LAYERS
    assert seen_own.get("diffusers") == layers and not seen_own.get("ours"), (
        f"unpatched, calls counted {seen_own}: want diffusers' all-to-all {layers}, ours 0"
    )
    # torch's all_to_all_single is not counted: diffusers' ring permutes its gradients with it.
    want = {"diffusers": 0, "ours": layers}
    got = {k: seen.get(k, 0) for k in want}
    assert got == want, f"patched, all-to-alls counted {seen}: want {want}"
    assert seen.get("ring", 0) > 0 and seen["ring"] == seen_own.get("ring"), (
        f"diffusers' ring collectives: {seen.get('ring')} patched, {seen_own.get('ring')} "
        "unpatched; want the same, above 0"
    )
    wan.assert_equal("output against diffusers' own", out, own_out)
    for name in sorted(own_grads):
        wan.assert_equal(f"gradient of {name} against diffusers' own", grads[name], own_grads[name])
    diff = close("output", out, want_out)
    worst = "not compared in bfloat16"
    if dtype == torch.float32:
        worst = f"{wan.assert_summed_grads(grads, want_grads, 'against one process'):.1e}"
    return f"counts unpatched {seen_own}, patched {seen}; output {diff:.1e}, grad rel {worst}"


# -- yunchang ----------------------------------------------------------------------------------


def yunchang_groups():
    """yunchang's PROCESS_GROUP (ULYSSES_PG, RING_PG), set once (new_group: collective)."""
    from yunchang.globals import PROCESS_GROUP, set_seq_parallel_pg

    if PROCESS_GROUP.ULYSSES_PG is None:
        set_seq_parallel_pg(ULYSSES, RING, dist.get_rank(), WORLD, use_ulysses_low=True)
    return PROCESS_GROUP


def check_yunchang(device) -> str:
    import yunchang.comm.all_to_all as comm
    from yunchang import LongContextAttention
    from yunchang.kernels import AttnType

    from fast_ulysses.integrations import yunchang

    groups = yunchang_groups()
    group = group_for(groups.ULYSSES_PG)
    (q, k, v), rows = qkv_case(device)
    counted = Counted()
    counted.wrap(comm.dist, "all_to_all_single", "torch")
    counted.wrap(dist, "batch_isend_irecv", "ring")
    counted.wrap(group, "all_to_all_single_4d", "ours")

    def run():
        layer = LongContextAttention(ring_impl_type="basic_pytorch", attn_type=AttnType.TORCH_FLASH)
        counted.reset()
        with torch.no_grad():
            out = layer(*(t[:, rows].contiguous() for t in (q, k, v)))
        return out, counted.reset()

    try:
        own, seen_own = run()
        patched = yunchang.patch_yunchang()
        assert "yunchang.hybrid.attn_layer.SeqAllToAll4D" in patched, patched
        out, seen = run()
    finally:
        yunchang.unpatch_yunchang()
        counted.unwrap()
    assert seen_own == {"torch": 4, "ring": seen_own.get("ring", 0)} and seen_own["ring"] > 0, (
        f"unpatched, calls counted {seen_own}: want yunchang's all-to-all 4, ring's above 0"
    )
    want = {"ours": 4, "ring": seen_own["ring"]}
    assert seen == want, f"patched, calls counted {seen}: want {want} (yunchang's all-to-all 0)"
    wan.assert_equal("output against yunchang's own", out, own)
    diff = close("output", out, one_process(q, k, v)[:, rows])
    return f"counts unpatched {seen_own}, patched {seen}; output {diff:.1e}"


# -- xDiT --------------------------------------------------------------------------------------


def usp_module(usp, groups):
    """xDiT's USP module with its parallel state as initialize_model_parallel leaves it for
    ring 2 x Ulysses 2 (the stand-ins the docstring names)."""
    runtime = types.SimpleNamespace(
        fp8_comms=None,
        attention_backend=usp.AttentionBackendType.SDPA_FLASH,
        runtime_config=types.SimpleNamespace(use_spargeattn_head_balance=False),
    )
    usp.PROCESS_GROUP = groups  # yunchang's, which it binds
    usp.get_runtime_state = lambda: runtime
    usp.get_ulysses_parallel_world_size = lambda: ULYSSES
    usp.get_ring_parallel_world_size = lambda: RING
    usp.get_sequence_parallel_world_size = lambda: WORLD
    return usp


def check_xfuser(device) -> str:
    import upstream_nodeps

    from fast_ulysses.integrations import xfuser

    groups = yunchang_groups()
    usp = usp_module(upstream_nodeps.load("xfuser", "xfuser.model_executor.layers.usp"), groups)
    group = group_for(groups.ULYSSES_PG)
    (q, k, v), rows = qkv_case(device)
    counted = Counted()
    counted.wrap(usp, "_sdpa_all_to_all_single", "xdit")
    counted.wrap(group, "all_to_all_single_4d", "ours")

    def run(tensors, **kwargs):
        local = [t[:, rows].transpose(1, 2).contiguous() for t in tensors]  # xDiT's (b, h, s, d)
        counted.reset()
        with torch.no_grad():
            out = usp.USP(*local, **kwargs)
        return out.transpose(1, 2), counted.reset()

    # GQA: k and v with half q's heads, repeated after the exchange (kv_head_repeat).
    kv = [t[:, :, ::2].contiguous() for t in (k, v)]
    cases = (
        ((q, k, v), dict(combine_qkv_a2a=False), 4, (q, k, v)),
        ((q, k, v), dict(combine_qkv_a2a=True), 2, (q, k, v)),
        ((q, *kv), dict(combine_qkv_a2a=True, kv_head_repeat=2), 2,
         (q, *(t.repeat_interleave(2, dim=2) for t in kv))),
    )  # fmt: skip
    details = []
    for tensors, kwargs, calls, whole in cases:
        own, seen_own = run(tensors, **kwargs)
        try:
            patched = xfuser.patch_xfuser()
            assert f"{usp.__name__}._ft_c_input_all_to_all" in patched, patched
            out, seen = run(tensors, **kwargs)
        finally:
            xfuser.unpatch_xfuser()
        what = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        assert seen_own == {"xdit": calls}, f"{what}, unpatched: {seen_own}, want xDiT's {calls}"
        assert seen == {"ours": calls}, f"{what}, patched: {seen}, want ours {calls}"
        wan.assert_equal(f"{what}: output against xDiT's own", out, own)
        want = one_process(*whole)[:, rows]
        details.append(f"{what}: {seen_own} -> {seen}, {close(what, out, want):.1e}")
    counted.unwrap()
    if device.type == "cuda":  # xDiT defines the layer only where CUDA is available
        layers = upstream_nodeps.load("xfuser", "xfuser.core.long_ctx_attention")
        want = one_process(q, k, v)[:, rows]
        details.append(check_xfuser_layer(layers, groups, (q, k, v), rows, want))
    return "; ".join(details)


def check_xfuser_layer(module, groups, qkv, rows, want) -> str:
    """xDiT's xFuserLongContextAttention (yunchang's LongContextAttention with xDiT's ring,
    AttnType.TORCH_FLASH) unpatched and after patch_xfuser(): bit for bit, our group carrying
    the 4 exchanges yunchang's SeqAllToAll4D made."""
    from yunchang.kernels import AttnType

    from fast_ulysses.integrations import xfuser

    group = group_for(groups.ULYSSES_PG)
    counted = Counted()
    counted.wrap(dist, "all_to_all_single", "yunchang")
    counted.wrap(group, "all_to_all_single_4d", "ours")

    def run():
        layer = module.xFuserLongContextAttention(attn_type=AttnType.TORCH_FLASH)
        counted.reset()
        with torch.no_grad():
            out = layer(None, *(t[:, rows].contiguous() for t in qkv))
        return out, counted.reset()

    try:
        own, seen_own = run()
        patched = xfuser.patch_xfuser()
        where = "xfuser.core.long_ctx_attention.hybrid.attn_layer.SeqAllToAll4D"
        assert where in patched, f"patch_xfuser did not rebind {where}: {patched}"
        out, seen = run()
    finally:
        xfuser.unpatch_xfuser()
        counted.unwrap()
    assert seen_own == {"yunchang": 4}, f"xFuserLongContextAttention unpatched: {seen_own}"
    assert seen == {"ours": 4}, f"xFuserLongContextAttention patched: {seen}, want ours 4"
    wan.assert_equal("xFuserLongContextAttention against xDiT's own", out, own)
    return f"xFuserLongContextAttention: {seen_own} -> {seen}, {close('layer', out, want):.1e}"


# -- main --------------------------------------------------------------------------------------

CHECKS = {"diffusers": check_diffusers, "yunchang": check_yunchang, "xfuser": check_xfuser}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--shared-gpu", action="store_true", help="every rank on cuda:0")
    args = parser.parse_args()
    wan.cpu_shims()
    backend = "cpu:gloo,cuda:gloo" if args.shared_gpu else "cpu:gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    assert dist.get_world_size() == WORLD, f"world {dist.get_world_size()}: run {WORLD} ranks"
    if args.shared_gpu:
        torch.cuda.set_device(0)
        standins.shared_gpu_shims()
    else:
        standins.register_cpu_flash()
    device = torch.device("cuda", 0) if args.shared_gpu else torch.device("cpu")
    report = Report(dist.get_rank())
    try:
        for framework in args.frameworks.split(","):
            with report.check(f"{framework}_usp_P{WORLD}") as entry:
                entry["detail"] = CHECKS[framework](device)
    except Exception:  # noqa: BLE001 - report everything, then fail this rank
        traceback.print_exc()
        sys.stdout.flush()
        return 1
    report.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
