"""One rank of the upstream-clients test (tests/python/test_upstream_clients.py on gloo CPU ranks
and the fallback; tests/gpu/test_upstream_clients_gpu.py with --shared-gpu, on the fast group).

Each check is the call pattern of one public client of the upstream API, written here from the
client's public file (not copied): the names, keywords and argument shapes it uses, in its order,
against `fast_ulysses.UlyssesGroup` on a GPU (`TorchUlyssesGroup`, the same surface, on CPU).
Every result is compared bit for bit with `fast_ulysses.simulate` on every rank's input, which
each rank rebuilds from its seed:

- vllm_omni: vLLM-Omni's diffusion transport: UlyssesGroup(process_group=, device=<index>,
  require_nvlink=, backend="pitched"), all_to_all_4d(x, mode=), empty_output + out=, and the
  async form with lend=True (a fifth live lent result refused).
- sglang_usp: SGLang's USP layer: one group per role on one process group, built in a
  try/except RuntimeError; q, k, v strided views of a fused qkv projection packed on the last
  axis and sent once into an empty_output buffer; the async form into a buffer; the groups
  dropped without destroy() and built again (the re-probe).
- sglang_backend: SGLang's first backend: all_to_all_single_4d_async on v, q, k with barrier
  only on the last, handles waited; _ce forms; signal_arrive_async / signal_wait; qk2 (the
  fused norm + RoPE pair) equal to qk_norm_rope_all_to_all_qk; norm_rope.
- sglang_h3: SGLang's packed transport: supports_world_size / SUPPORTED_WORLD_SIZES /
  supports_dtype, UlyssesGroup.create(), .device/.backend/.world_size/.stream,
  unsupported_reason, allocate_output, all_to_all_4d(out=), q/k/v as strided views of one
  packed result.
- lightx2v: LightX2V's attention: UlyssesGroup(process_group=, device=, initial_pool_bytes=) in a
  try/except, all_to_all_single_4d(..., tag=, use_tma=) on q, k, v and the output.
- packed_views: q, k, v passed as views of a packed projection ((b, s, 3, N, d)[:, :, i] and a
  narrow of (b, s, 3N, d)) move as they stand, equal to their contiguous copies.
- refusals: a backend not implemented, a bad use_tma, lend with out=, an unknown qk2 mode and
  an empty_output buffer of another call are refused by name on every rank, and the group
  goes on working.
"""

from __future__ import annotations

import gc
import sys
import warnings

import torch
from multirank import parse_shared_gpu_only, run_on_subgroups

import fast_ulysses as fu
from fast_ulysses.fused import norm_rope_reference

S_LOCAL, D = 8, 16
DTYPE = torch.bfloat16


def check_names(world: int, fast: bool) -> list[str]:
    from multirank import subgroup_sizes

    return [f"{name}_P{P}" for P in subgroup_sizes(world, fast) for name, _ in CHECKS]


class Ctx:
    """One subgroup's state: the group class the clients call `UlyssesGroup`, and helpers."""

    def __init__(self, pg, P, device, fast):
        self.pg, self.P, self.device, self.fast = pg, P, device, fast
        self.rank = torch.distributed.get_rank(pg)
        self.Group = fu.UlyssesGroup if fast else fu.TorchUlyssesGroup

    def inputs(self, seed: int, shape_of_rank) -> list[torch.Tensor]:
        """Every rank's input (CPU), seeded per (seed, rank)."""
        xs = []
        for r in range(self.P):
            g = torch.Generator().manual_seed(seed * 1000 + r)
            xs.append(torch.randn(*shape_of_rank(r), generator=g).to(DTYPE))
        return xs

    def mine(self, xs) -> torch.Tensor:
        return xs[self.rank].to(self.device)

    def expect(self, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        got = got.detach().cpu()
        if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
            raise AssertionError(
                f"{what}: got {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} "
                f"{want.dtype}; equal values: {got.shape == want.shape and torch.equal(got, want)}"
            )

    def refused(self, what: str, fn, *words: str) -> None:
        try:
            fn()
        except fu.FastUlyssesError as error:
            missing = [w for w in words if w not in str(error)]
            if missing:
                raise AssertionError(f"{what}: message lacks {missing}: {error}") from None
            return
        raise AssertionError(f"{what}: not refused")


def vllm_omni(c: Ctx) -> None:
    H = 2 * c.P
    g = c.Group(
        process_group=c.pg,
        device=0 if c.fast else None,
        require_nvlink=True,
        backend="pitched",
    )
    xs = c.inputs(1, lambda r: (1, S_LOCAL, H, D))
    want = fu.simulate(xs, 0)
    y = g.all_to_all_4d(c.mine(xs), mode=0)  # SeqAllToAll4D (scatter 2, gather 1): mode 0
    c.expect("all_to_all_4d mode 0", y, want[c.rank])
    c.expect("all_to_all_4d mode 1", g.all_to_all_4d(y, mode=1), xs[c.rank])
    xs2 = c.inputs(2, lambda r: (1, S_LOCAL, H, D))
    buffer = g.empty_output(c.mine(xs2), mode=0)
    for seed in (3, 4):  # the zero-copy slot, reused
        xs3 = c.inputs(seed, lambda r: (1, S_LOCAL, H, D))
        returned = g.all_to_all_4d(c.mine(xs3), mode=0, out=buffer)
        assert returned is buffer, "all_to_all_4d(out=buffer) did not return the buffer"
        c.expect(f"empty_output + out= (seed {seed})", buffer, fu.simulate(xs3, 0)[c.rank])
    lent = [g.all_to_all_4d_async(c.mine(xs), mode=0, lend=True) for _ in range(4)]
    c.refused(
        "a fifth live lent result", lambda: g.all_to_all_4d_async(c.mine(xs), lend=True), "lend"
    )
    for i, result in enumerate(lent):
        c.expect(f"lent result {i}", result.wait(), want[c.rank])
    del lent, result
    gc.collect()
    again = g.all_to_all_4d_async(c.mine(xs2), mode=0, lend=True)
    c.expect("lend after the others were dropped", again.wait(), fu.simulate(xs2, 0)[c.rank])
    # A detach() or .data of a lent result holds its window as much as the result does.
    kept = [again.wait().detach()] + [
        g.all_to_all_4d_async(c.mine(xs), mode=0, lend=True).wait().data for _ in range(3)
    ]
    del again
    gc.collect()
    c.refused(
        "a lend whose window a detach() holds",
        lambda: g.all_to_all_4d_async(c.mine(xs), lend=True),
        "lend",
    )
    c.expect("the detached lent result", kept[0], fu.simulate(xs2, 0)[c.rank])
    del kept
    gc.collect()
    c.expect(
        "lend after the detached ones went",
        g.all_to_all_4d_async(c.mine(xs), lend=True).wait(),
        want[c.rank],
    )
    g.destroy()


def sglang_usp(c: Ctx) -> None:
    H = 2 * c.P
    for probe in range(2):  # the second pass is the re-probe: groups dropped, not destroyed
        groups = {}
        try:
            for role in ("default", "q", "k", "v"):
                groups[role] = c.Group(process_group=c.pg)
        except RuntimeError as error:
            raise AssertionError(f"building the groups (pass {probe}) raised: {error}") from None
        xs = c.inputs(10 + probe, lambda r: (S_LOCAL, 3 * H * D))  # a fused qkv projection
        qkv = c.mine(xs)
        q, k, v = (qkv.view(S_LOCAL, 3, H, D)[:, i] for i in range(3))  # strided views
        wants = [
            fu.simulate([x.view(S_LOCAL, 3, H, D)[:, i].unsqueeze(0) for x in xs], 0)[c.rank]
            for i in range(3)
        ]
        packed = torch.cat([q, k, v], dim=-1).unsqueeze(0)  # (1, s, h, 3d), destination-major
        out = groups["default"].empty_output(packed, mode=0)
        groups["default"].all_to_all_4d(packed, mode=0, out=out)
        for name, got, want in zip("qkv", out.squeeze(0).split(D, -1), wants):
            c.expect(f"packed {name} (pass {probe})", got.unsqueeze(0), want)
        for role, t, want in zip("qkv", (q, k, v), wants):  # the async path, one group a role
            buffer = groups[role].empty_output(t.unsqueeze(0), mode=0)
            handle = groups[role].all_to_all_4d_async(t.unsqueeze(0), mode=0, out=buffer)
            c.expect(f"async {role} (pass {probe})", handle.wait(), want)
        o = c.mine(fu.simulate(c.inputs(20, lambda r: (1, S_LOCAL, H, D)), 0))
        back = groups["default"].all_to_all_4d(o, mode=1)
        c.expect(
            f"output mode 1 (pass {probe})",
            back,
            c.inputs(20, lambda r: (1, S_LOCAL, H, D))[c.rank],
        )
        if probe == 0:
            groups.clear()  # dropped without destroy(), as the client's re-probe does
            gc.collect()
    for group in groups.values():
        group.destroy()


def sglang_backend(c: Ctx) -> None:
    H = 2 * c.P
    g = c.Group(process_group=c.pg)
    shape = lambda r: (1, S_LOCAL, H, D)  # noqa: E731
    xs = {n: c.inputs(30 + i, shape) for i, n in enumerate("vqk")}
    handles = {
        n: g.all_to_all_single_4d_async(
            c.mine(xs[n]), mode=0, tag=f"usp_{n}", use_tma=None, barrier=(n == "k")
        )
        for n in "vqk"
    }
    for n in "vqk":
        c.expect(f"async {n}", handles[n].wait(), fu.simulate(xs[n], 0)[c.rank])
    o = c.mine(fu.simulate(xs["q"], 0))
    c.expect(
        "output", g.all_to_all_single_4d(o, mode=1, tag="usp_o", use_tma=False), xs["q"][c.rank]
    )
    c.expect(
        "_ce",
        g.all_to_all_single_4d_ce(c.mine(xs["v"]), mode=0, tag="ce"),
        fu.simulate(xs["v"], 0)[c.rank],
    )
    handle = g.all_to_all_single_4d_ce_async(c.mine(xs["k"]), mode=0, tag="ce_async", barrier=True)
    c.expect("_ce_async", handle.wait(), fu.simulate(xs["k"], 0)[c.rank])
    a = g.all_to_all_single_4d_async(c.mine(xs["q"]), mode=0, tag="usp_q", barrier=False)
    b = g.all_to_all_single_4d_async(c.mine(xs["k"]), mode=0, tag="usp_k", barrier=False)
    c.refused("wait() before the barrier", a.wait, "barrier", "signal_arrive_async")
    g.signal_arrive_async()
    g.signal_wait()
    c.expect("after signal_wait q", a.wait(), fu.simulate(xs["q"], 0)[c.rank])
    c.expect("after signal_wait k", b.wait(), fu.simulate(xs["k"], 0)[c.rank])
    c.refused("signal_wait without an arrive", g.signal_wait, "signal_arrive_async")
    # qk2 with the client's arguments: fp32 weights of H*D, fp32 cos/sin of (s_local, D/2).
    gen = torch.Generator().manual_seed(40)
    wq, wk = (torch.rand(H * D, generator=gen).to(c.device) + 0.5 for _ in range(2))
    cos, sin = (torch.rand(S_LOCAL, D // 2, generator=gen).to(c.device) for _ in range(2))
    q, k = c.mine(xs["q"]), c.mine(xs["k"])
    qo, ko = g.all_to_all_single_4d_qk2(
        q, k, wq, wk, cos, sin, mode="cross_head", interleaved=True, eps=1e-6, tag="usp_qk"
    )
    qo, ko = qo.clone(), ko.clone()  # (borrowed: the reference call below reuses no tag)
    rq, rk = fu.qk_norm_rope_all_to_all_qk(
        g, q, k, ("ref_q", "ref_k"), norm_weights=(wq, wk), eps=1e-6, cos=cos, sin=sin
    )
    c.expect("qk2 q", qo, rq.cpu())
    c.expect("qk2 k", ko, rk.cpu())
    w = torch.rand(D, generator=gen).to(c.device)
    c.expect(
        "norm_rope",
        fu.norm_rope(q, w, cos, sin, mode="per_head", interleaved=False, eps=1e-5),
        norm_rope_reference(q, w, 1e-5, cos, sin, norm="per_head", rope_style="half").cpu(),
    )
    g.destroy()


def sglang_h3(c: Ctx) -> None:
    H, T = 2 * c.P, S_LOCAL
    assert fu.supports_world_size(c.P) and c.P in tuple(fu.SUPPORTED_WORLD_SIZES)
    assert fu.supports_dtype(DTYPE) and not fu.supports_dtype(torch.float64)
    if c.fast:  # a device only some ranks lack: every rank votes None (none is left waiting)
        bad = torch.device("cuda", torch.cuda.device_count()) if c.rank == c.P - 1 else c.device
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert c.Group.create(process_group=c.pg, device=bad) is None, "create() built a group"
        assert any("unavailable" in str(w.message) for w in caught), [
            str(w.message) for w in caught
        ]
    native = c.Group.create(process_group=c.pg, device=c.device)
    assert native is not None, "create() returned None"
    assert native.world_size == c.P and isinstance(native.backend, str), native.backend
    if c.fast:
        assert native.device == c.device and native.stream == torch.cuda.current_stream(c.device)
    xs = c.inputs(50, lambda r: (T, H, 3, D))  # the client's [T_local, H, 3, D] exchange
    source = c.mine(xs).reshape(1, T, 3 * H, D)
    assert native.unsupported_reason(tuple(source.shape), source.dtype, 0) is None
    assert native.unsupported_reason((1, T, 3 * H + 1, D), DTYPE, 0) is not None or c.P == 1
    workspace = native.allocate_output(source, 0)
    native.all_to_all_4d(source, mode=0, out=workspace)
    for i, name in enumerate("qkv"):
        view = workspace.view(T * c.P, H // c.P, 3, D)[:, :, i]  # a strided view, as the client
        want = fu.simulate([x[:, :, i].unsqueeze(0) for x in xs], 0)[c.rank][0]
        c.expect(f"packed {name}", view, want)
    attn = c.mine(fu.simulate([x[:, :, 0].unsqueeze(0) for x in xs], 0))[0]  # [T*P, H/P, D]
    back = native.all_to_all_4d(attn.unsqueeze(0), mode=1).view(T, H, D)
    c.expect("output", back, xs[c.rank][:, :, 0])
    native.destroy()


def lightx2v(c: Ctx) -> None:
    H = 2 * c.P
    try:
        g = c.Group(process_group=c.pg, device=c.device, initial_pool_bytes=1 << 20)
    except Exception as error:  # noqa: BLE001 - the client's own fallback catches everything
        raise AssertionError(f"the client would fall back: {error}") from None
    xs = {n: c.inputs(60 + i, lambda r: (S_LOCAL, H, D)) for i, n in enumerate("qkv")}
    outs = {}
    for n in "qkv":
        t = c.mine(xs[n]).reshape(1, S_LOCAL, H, D)
        outs[n] = g.all_to_all_single_4d(t, mode=0, tag=f"lightx2v_{n}", use_tma=None)
        c.expect(n, outs[n], fu.simulate([x.unsqueeze(0) for x in xs[n]], 0)[c.rank])
    attn = outs["v"][0].reshape(1, S_LOCAL * c.P, H // c.P, D)
    back = g.all_to_all_single_4d(attn, mode=1, tag="lightx2v_out", use_tma=True)
    c.expect("output", back, xs["v"][c.rank].unsqueeze(0))
    g.destroy()


def packed_views(c: Ctx) -> None:
    H = 2 * c.P
    g = c.Group(process_group=c.pg)
    xs = c.inputs(70, lambda r: (1, S_LOCAL, 3, H, D))
    for i in range(3):
        view = c.mine(xs)[:, :, i]
        assert not view.is_contiguous()
        want = fu.simulate([x[:, :, i].contiguous() for x in xs], 0)[c.rank]
        c.expect(f"(b, s, 3, N, d)[:, :, {i}]", g.all_to_all_4d(view, mode=0), want)
        flat = c.mine(xs).view(1, S_LOCAL, 3 * H, D).narrow(2, i * H, H)
        c.expect(f"narrow {i} of (b, s, 3N, d)", g.all_to_all_4d(flat, mode=0), want)
    g.destroy()


def refusals(c: Ctx) -> None:
    H = 2 * c.P
    c.refused(
        "backend='packed'",
        lambda: c.Group(process_group=c.pg, backend="packed"),
        "backend='packed'",
    )
    g = c.Group(process_group=c.pg)
    xs = c.inputs(80, lambda r: (1, S_LOCAL, H, D))
    x = c.mine(xs)
    c.refused("use_tma='yes'", lambda: g.all_to_all_single_4d(x, 0, "t", use_tma="yes"), "use_tma")
    c.refused(
        "lend with out=",
        lambda: g.all_to_all_4d_async(x, out=torch.empty_like(x), lend=True),
        "lend",
    )
    buffer = g.empty_output(x, mode=0)
    other = c.mine(c.inputs(81, lambda r: (1, 2 * S_LOCAL, H, D)))
    c.refused(
        "another call's buffer", lambda: g.all_to_all_4d(other, mode=0, out=buffer), "out has shape"
    )
    q = x
    w = torch.ones(H * D, device=c.device)
    cs = torch.ones(S_LOCAL, D // 2, device=c.device)
    c.refused(
        "qk2 mode='rms'",
        lambda: g.all_to_all_single_4d_qk2(q, q, w, w, cs, cs, mode="rms"),
        "mode='rms'",
    )
    c.expect("after the refusals", g.all_to_all_4d(x, mode=0), fu.simulate(xs, 0)[c.rank])
    g.destroy()


CHECKS = [
    ("vllm_omni", vllm_omni),
    ("sglang_usp", sglang_usp),
    ("sglang_backend", sglang_backend),
    ("sglang_h3", sglang_h3),
    ("lightx2v", lightx2v),
    ("packed_views", packed_views),
    ("refusals", refusals),
]


def main() -> int:
    args = parse_shared_gpu_only(__doc__)

    def body(report, pg, P, device):
        c = Ctx(pg, P, device, args.shared_gpu)
        for name, check in CHECKS:
            with report.check(f"{name}_P{P}"):
                check(c)

    return run_on_subgroups(args.shared_gpu, body)


if __name__ == "__main__":
    sys.exit(main())
