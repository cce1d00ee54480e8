"""Correctness checks of a Ulysses group, run by every rank of a torchrun job
(a2a_correctness.py). Every result is compared bit-exactly with fast_ulysses.simulate on inputs
every rank can rebuild locally (seeded per call and rank), and optionally with a reference group
(TorchUlyssesGroup) fed the same inputs."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time

import torch
import torch.distributed as dist

import fast_ulysses as fu
from fast_ulysses.plan import input_shape as plan_input_shape

LAYOUTS = ("bshd", "sbhd", "bhsd")


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    seq_splits: tuple
    head_splits: tuple
    head_dim: int
    dtype: torch.dtype
    layout: str

    def input_shape(self, rank: int, mode: int = 0) -> tuple:
        """Rank `rank`'s input shape for `mode`, from the plan."""
        return plan_input_shape(
            len(self.seq_splits),
            rank,
            mode,
            batch=self.batch,
            head_dim=self.head_dim,
            seq_splits=self.seq_splits,
            head_splits=self.head_splits,
            layout=self.layout,
        )


def balanced(total: int, parts: int) -> tuple:
    return tuple(total // parts + (1 if i < total % parts else 0) for i in range(parts))


def cases(world_size: int) -> list[Case]:
    """Every layout; even and uneven seq and head splits (zero rows included); fp16 and bf16;
    b in {1, 2}; the real uneven head counts (Wan 1.3B 12 on 8, HunyuanVideo 24 on 5); and rows
    narrower than 16 bytes, which take the SM copy path: fp32 with d = 1 (the softmax LSE of
    hybrid Ulysses + Ring) and fp16 with d = 3, in every layout."""
    P = world_size
    seqs = {"even": (4,) * P, "uneven": tuple((3 * i + 1) % 5 for i in range(P))}
    if sum(seqs["uneven"]) == 0:
        seqs["uneven"] = (3,) * P
    heads = {"even": (2,) * P, "uneven": balanced(2 * P + 1, P)}
    if P == 8:
        heads["wan-1.3b"] = balanced(12, 8)
    if P == 5:
        heads["hunyuan"] = balanced(24, 5)
    out = []
    for (sname, seq), (hname, head), layout, dtype, batch in itertools.product(
        seqs.items(), heads.items(), LAYOUTS, (torch.float16, torch.bfloat16), (1, 2)
    ):
        if dtype == torch.float16 and batch == 2 and sname == hname:
            continue  # keep the matrix moderate; every other combination runs
        out.append(Case(batch, seq, head, 64, dtype, layout))
    for layout, (seq, head) in itertools.product(
        LAYOUTS, ((seqs["uneven"], heads["uneven"]), (seqs["even"], heads["even"]))
    ):
        out.append(Case(2, seq, head, 1, torch.float32, layout))
        out.append(Case(1, seq, head, 3, torch.float16, layout))
    return out


def inputs_for(case: Case, world_size: int, seed: int, mode: int = 0) -> list[torch.Tensor]:
    """Every rank's input for one call, on the CPU, the same on every rank."""
    result = []
    for r in range(world_size):
        g = torch.Generator().manual_seed(seed * 1009 + r)
        shape = case.input_shape(r, mode)
        result.append((torch.randn(shape, generator=g) * 4 + 1).to(case.dtype))
    return result


class Checker:
    """Runs the checks on one group; `reference` (optional) is a second group with the same
    entry points run on `reference_device` (a TorchUlyssesGroup)."""

    def __init__(self, group, rank, world_size, device, reference=None, reference_device=None):
        self.group, self.rank, self.P, self.device = group, rank, world_size, device
        self.reference, self.reference_device = reference, reference_device
        self.passed: list[str] = []

    def expect(self, name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        got = got.to("cpu")
        if got.shape != want.shape or not torch.equal(
            got.view(torch.uint8) if got.numel() else got,
            want.view(torch.uint8) if want.numel() else want,
        ):
            bad = (
                "shape"
                if got.shape != want.shape
                else f"{(got != want).sum().item()} of {want.numel()} elements"
            )
            raise AssertionError(
                f"rank {self.rank}: {name}: mismatch ({bad}); got shape "
                f"{tuple(got.shape)}, want {tuple(want.shape)}"
            )

    def splits(self, case):
        return dict(
            seq_splits=list(case.seq_splits), head_splits=list(case.head_splits), layout=case.layout
        )

    def check_matrix(self) -> None:
        for i, case in enumerate(cases(self.P)):
            xs = inputs_for(case, self.P, seed=i)
            want = fu.simulate(xs, 0, **self.splits(case))
            x = xs[self.rank].to(self.device)
            y = self.group.all_to_all_single_4d(x, 0, "matrix", **self.splits(case))
            self.expect(f"case {i} {case} mode 0", y, want[self.rank])
            z = self.group.all_to_all_single_4d(y, 1, "matrix-back", **self.splits(case))
            self.expect(f"case {i} mode 1 (round trip)", z, xs[self.rank])
            back = fu.simulate(want, 1, **self.splits(case))
            self.expect(f"case {i} mode 1 vs simulate", z, back[self.rank])
            yb = self.group.all_to_all_single_4d_borrowed(x, 0, "matrix-b", **self.splits(case))
            self.expect(f"case {i} borrowed mode 0", yb, want[self.rank])
            if self.reference is not None:
                yr = self.reference.all_to_all_single_4d(
                    xs[self.rank].to(self.reference_device), 0, "matrix", **self.splits(case)
                )
                self.expect(f"case {i} vs reference group", y, yr.to("cpu"))
        self.passed.append(f"matrix: {len(cases(self.P))} cases x (copy, round trip, borrowed)")

    def check_async_consumer(self) -> None:
        case = cases(self.P)[0]
        xs = inputs_for(case, self.P, seed=101)
        want = fu.simulate(xs, 0, **self.splits(case))[self.rank]
        y = self.group.all_to_all_single_4d(
            xs[self.rank].to(self.device), 0, "async", **self.splits(case)
        )
        z = y * 2 + 1  # the first aten op waits, stream-ordered; no synchronize anywhere
        self.expect("async result consumed by another op", z, want * 2 + 1)
        self.passed.append("async result consumed without synchronize")

    def check_borrowed_lifetime(self) -> None:
        case = cases(self.P)[-1]
        xa, xb, xa2 = (inputs_for(case, self.P, seed=s) for s in (201, 202, 203))
        wa, wb, wa2 = (fu.simulate(x, 0, **self.splits(case))[self.rank] for x in (xa, xb, xa2))
        a = self.group.all_to_all_single_4d_borrowed(
            xa[self.rank].to(self.device), 0, "life-a", **self.splits(case)
        )
        b = self.group.all_to_all_single_4d_borrowed(
            xb[self.rank].to(self.device), 0, "life-b", **self.splits(case)
        )
        self.expect("borrowed a after a call with another tag", a, wa)
        self.expect("borrowed b", b, wb)
        a2 = self.group.all_to_all_single_4d_borrowed(
            xa2[self.rank].to(self.device), 0, "life-a", **self.splits(case)
        )
        # (a2's first use orders the stream after its transfer; the old handle `a` is no longer
        # a valid result, read here only to show the window was overwritten.)
        self.expect("the new borrowed a", a2, wa2)
        self.expect("borrowed a overwritten by the next call with its tag", a, wa2)
        self.expect("borrowed b untouched by tag a", b, wb)
        self.passed.append("borrowed lifetime")

    def check_deferred_barrier(self) -> None:
        case = cases(self.P)[1]
        tags = ("q", "k", "v")
        xs = [inputs_for(case, self.P, seed=300 + i) for i in range(3)]
        wants = [fu.simulate(x, 0, **self.splits(case))[self.rank] for x in xs]
        outs = [
            self.group.all_to_all_single_4d_borrowed(
                x[self.rank].to(self.device), 0, t, barrier=False, **self.splits(case)
            )
            for x, t in zip(xs, tags)
        ]
        try:
            self.group.all_to_all_single_4d_borrowed(
                xs[0][self.rank].to(self.device), 0, "q", barrier=False, **self.splits(case)
            )
        except ValueError as error:
            assert "barrier()" in str(error), error
        else:
            raise AssertionError("reusing a deferred tag before barrier() did not raise")
        self.group.barrier()
        for t, got, want in zip(tags, outs, wants):
            self.expect(f"deferred {t} after barrier()", got, want)
        self.passed.append("barrier=False on q, k, v then barrier()")

    def check_back_to_back(self, iterations: int) -> None:
        """Fresh random inputs every call, issued back to back (no host sync), results kept
        (borrowed ones cloned on the stream) and checked in batches: window reuse races show."""
        case_list = cases(self.P)
        batch = 50
        for start in range(0, iterations, batch):
            issued = []
            for t in range(start, min(start + batch, iterations)):
                case = case_list[t % len(case_list)]
                mode = t % 2
                xs = inputs_for(case, self.P, seed=10_000 + t, mode=mode)
                x = xs[self.rank].to(self.device, non_blocking=True)
                tag = f"loop{t % 3}"
                if t % 3 == 2:
                    y = self.group.all_to_all_single_4d_borrowed(
                        x, mode, tag, **self.splits(case)
                    ).clone()
                else:
                    y = self.group.all_to_all_single_4d(x, mode, tag, **self.splits(case))
                issued.append((t, case, mode, xs, y))
            for t, case, mode, xs, y in issued:
                want = fu.simulate(xs, mode, **self.splits(case))[self.rank]
                self.expect(f"back-to-back call {t}", y, want)
        self.passed.append(f"{iterations} back-to-back calls, every result checked")

    def check_eager_graphs(self) -> None:
        """Eager calls issued from cached CUDA graphs (FAST_ULYSSES_EAGER_GRAPHS), on a process
        group of its own with the switch on, then off (the switch is read when a group is
        built). On: copy and borrowed calls repeating one signature, x at a new address each
        call and then at one address; rows the copy engines are not given (a kernel in the
        graph); q, k, v with barrier=False + barrier(); an owned call while a deferred one is
        open, then barrier() and one more call: every one must be launched from a graph
        (none at P = 1, which has no communication stream work). Then one signature whose x
        moves on every call: it must turn eager-only after a bounded number of graphs. Off: no
        graph at all. Every result checked against simulate. (stats()'s wide_flags, 1 where
        the GPU takes 64-bit stream memory operations, is reported with each pass.)"""
        lines = []
        name = "FAST_ULYSSES_EAGER_GRAPHS"
        saved = os.environ.get(name)
        try:
            for on in (True, False):
                os.environ[name] = "1" if on else "0"
                pg = dist.new_group(list(range(self.P)))
                group = fu.UlyssesGroup(pg, 1 << 20)
                try:
                    line = self._eager_graph_calls(group, on)
                    lines.append(f"{line} (wide_flags {group.stats()['wide_flags']})")
                finally:
                    group.destroy()
        finally:
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved
        self.passed.append("eager graphs: " + "; ".join(lines))

    def _eager_graph_calls(self, group, on: bool) -> str:
        graphs = on and self.P > 1
        switch = f"FAST_ULYSSES_EAGER_GRAPHS={int(on)}"
        aligned = Case(1, (4,) * self.P, (2,) * self.P, 64, torch.bfloat16, "bshd")  # 128-byte rows
        narrow = Case(1, (3,) * self.P, (1,) * self.P, 4, torch.bfloat16, "bshd")  # 8-byte rows
        before = group.stats()
        kept, static, n = [], {}, 0
        for t in range(16):
            case = narrow if t >= 12 else aligned
            xs = inputs_for(case, self.P, seed=600 + t)
            if t < 6:  # a new tensor each call, the old ones kept alive: a new address
                x = xs[self.rank].to(self.device)
                kept.append(x)
            else:  # one tensor per case, refilled: one address
                if case not in static:
                    static[case] = torch.empty_like(xs[self.rank], device=self.device)
                x = static[case].copy_(xs[self.rank])
            want = fu.simulate(xs, 0, **self.splits(case))[self.rank]
            tag = ("narrow" if case is narrow else "graphs") + ("-b" if t % 2 else "")
            if t % 2:
                y = group.all_to_all_single_4d_borrowed(x, 0, tag, **self.splits(case))
            else:
                y = group.all_to_all_single_4d(x, 0, tag, **self.splits(case))
            where = "a new" if t < 6 else "one"
            self.expect(f"{switch}: call {t}, tag {tag}, x at {where} address", y, want)
            n += 1
        xs = [inputs_for(aligned, self.P, seed=700 + i) for i in range(3)]
        outs = [
            group.all_to_all_single_4d_borrowed(
                x[self.rank].to(self.device),
                0,
                f"graphs-{t}",
                barrier=False,
                **self.splits(aligned),
            )
            for x, t in zip(xs, "qkv")
        ]
        group.barrier()
        for t, got, x in zip("qkv", outs, xs):
            self.expect(
                f"{switch}: deferred {t} after barrier()",
                got,
                fu.simulate(x, 0, **self.splits(aligned))[self.rank],
            )
        n += 3
        # A call closed by its own handshake while a deferred call is open (its graph goes on the
        # communication stream, after the deferred one), then barrier(), then one more (its
        # graph on the caller's stream: nothing deferred is open).
        xq, xo, xp = (inputs_for(aligned, self.P, seed=710 + i) for i in range(3))
        q = group.all_to_all_single_4d_borrowed(
            xq[self.rank].to(self.device), 0, "graphs-q", barrier=False, **self.splits(aligned)
        )
        o = group.all_to_all_single_4d(
            xo[self.rank].to(self.device), 0, "graphs-o", **self.splits(aligned)
        )
        self.expect(
            f"{switch}: owned call while q is deferred",
            o,
            fu.simulate(xo, 0, **self.splits(aligned))[self.rank],
        )
        group.barrier()
        self.expect(
            f"{switch}: deferred q after the owned call and barrier()",
            q,
            fu.simulate(xq, 0, **self.splits(aligned))[self.rank],
        )
        p = group.all_to_all_single_4d_borrowed(
            xp[self.rank].to(self.device), 0, "graphs-p", **self.splits(aligned)
        )
        self.expect(
            f"{switch}: borrowed call after barrier()",
            p,
            fu.simulate(xp, 0, **self.splits(aligned))[self.rank],
        )
        n += 3
        stats = group.stats()
        launched = stats["graph_calls"] - before["graph_calls"]
        expected = n if graphs else 0
        assert launched == expected, (
            f"rank {self.rank}: {n} eager calls, {launched} launched from cached graphs, "
            f"expected {expected} ({switch}, P = {self.P}); stats {stats}"
        )
        # x moving without end: one graph per new address up to the cache's bound, then the
        # signature is issued call by call.
        moving = 20
        before = stats
        for t in range(moving):
            xs = inputs_for(aligned, self.P, seed=800 + t)
            x = xs[self.rank].to(self.device)
            kept.append(x)
            y = group.all_to_all_single_4d_borrowed(x, 0, "graphs-moving", **self.splits(aligned))
            self.expect(
                f"{switch}: call {t} with x moving on every call",
                y,
                fu.simulate(xs, 0, **self.splits(aligned))[self.rank],
            )
        stats = group.stats()
        moved = {
            k: stats[k] - before[k]
            for k in ("graph_calls", "graphs_cached", "eager_only_signatures")
        }
        ok = (
            (
                0 < moved["graph_calls"] == moved["graphs_cached"] < moving
                and moved["eager_only_signatures"] == 1
            )
            if graphs
            else moved == {"graph_calls": 0, "graphs_cached": 0, "eager_only_signatures": 0}
        )
        assert ok, (
            f"rank {self.rank}: {switch}, {moving} calls with x at a new address each: {moved}; "
            "expected "
            + (
                "a graph for each of the first few addresses, then the signature eager-only"
                if graphs
                else "no graph"
            )
            + f"; stats {stats}"
        )
        return (
            f"{switch}: {n} calls, {launched} from cached graphs; x moving: "
            f"{moved['graph_calls']} of {moving} from graphs"
            + (", then eager-only" if graphs else "")
        )

    def check_bad_calls(self) -> None:
        x = torch.randn(1, 4, 2 * self.P + 1, 64, dtype=torch.bfloat16, device=self.device)
        bad = [
            (
                "indivisible heads",
                lambda: self.group.all_to_all_single_4d(x, 0, "bad"),
                "head_splits",
            )
            if self.P > 1
            else None,
            ("bad mode", lambda: self.group.all_to_all_single_4d(x, 2, "bad"), "mode"),
            (
                "bad layout",
                lambda: self.group.all_to_all_single_4d(x, 0, "bad", layout="bsdh"),
                "layout",
            ),
            ("cpu input", lambda: self.group.all_to_all_single_4d(x.cpu(), 0, "bad"), "device"),
        ]
        for entry in filter(None, bad):
            name, call, needle = entry
            try:
                call()
            except ValueError as error:
                assert needle in str(error), f"{name}: message {error!s} lacks {needle!r}"
            else:
                raise AssertionError(f"bad call '{name}' did not raise ValueError")
        self.passed.append("bad calls raise ValueError before anything is sent")

    def expect_refused(self, name: str, call, needles) -> None:
        """`call()` raises FastUlyssesError whose message holds every one of `needles`."""
        try:
            call()
        except fu.FastUlyssesError as error:
            for needle in needles:
                assert needle in str(error), f"rank {self.rank}: {name}: {error!s} lacks {needle!r}"
        else:
            raise AssertionError(f"rank {self.rank}: {name}: did not raise FastUlyssesError")

    def check_aliasing(self) -> None:
        """Inputs and out= buffers whose bytes overlap the window of the call's tag are refused
        on every rank before anything is sent (a whole borrowed result fed back on its own tag,
        a batch slice of one, and one passed as out=); the group then works."""
        case = Case(2, (4,) * self.P, (2,) * self.P, 64, torch.bfloat16, "bshd")
        xs = inputs_for(case, self.P, seed=401)
        want = fu.simulate(xs, 0, **self.splits(case))[self.rank]
        x = xs[self.rank].to(self.device)
        y = self.group.all_to_all_single_4d_borrowed(x, 0, "alias", **self.splits(case))
        self.expect("borrowed result before the refused calls", y, want)
        window = y.elem if hasattr(y, "elem") else y  # the plain window view
        self.expect_refused(
            "a borrowed result fed back on its tag",
            lambda: (self.group.all_to_all_single_4d_borrowed(y, 1, "alias", **self.splits(case))),
            ("x overlaps the receive window of tag 'alias'",),
        )
        self.expect_refused(
            "its plain window view fed back",
            lambda: (
                self.group.all_to_all_single_4d_borrowed(window, 1, "alias", **self.splits(case))
            ),
            ("x overlaps the receive window of tag 'alias'",),
        )
        self.expect_refused(
            "the owned call on the same input",
            lambda: (self.group.all_to_all_single_4d(window, 1, "alias", **self.splits(case))),
            ("x overlaps the receive window of tag 'alias'",),
        )
        self.expect_refused(
            "a batch slice of a borrowed result",
            lambda: (
                self.group.all_to_all_single_4d_borrowed(
                    window[1:2], 1, "alias", **self.splits(case)
                )
            ),
            ("x overlaps",),
        )
        self.expect_refused(
            "a borrowed result as out= on its tag",
            lambda: (
                self.group.all_to_all_single_4d(x, 0, "alias", out=window, **self.splits(case))
            ),
            ("out overlaps the receive window of tag 'alias'",),
        )
        # The same bytes on another tag are fine: that window is not written by this call.
        back = self.group.all_to_all_single_4d(window, 1, "alias-back", **self.splits(case))
        self.expect("a borrowed result sent back on another tag", back, xs[self.rank])
        again = self.group.all_to_all_single_4d_borrowed(x, 0, "alias", **self.splits(case))
        self.expect("the tag after the refused calls", again, want)
        self.passed.append("aliasing: input or out= in the tag's window refused; group works")

    def check_out(self) -> None:
        """out= fills and returns the caller's buffer, bit-exact, ready in the current stream's
        order (read straight after the call, without the returned tensor); every mismatch of
        out raises FastUlyssesError naming it."""
        for i, case in enumerate(cases(self.P)[:4]):
            xs = inputs_for(case, self.P, seed=500 + i)
            want = fu.simulate(xs, 0, **self.splits(case))[self.rank]
            x = xs[self.rank].to(self.device)
            buf = torch.full(want.shape, 7, dtype=case.dtype, device=self.device)
            got = self.group.all_to_all_single_4d(x, 0, "out", out=buf, **self.splits(case))
            assert got is buf, f"rank {self.rank}: out= returned {type(got).__name__}, not out"
            self.expect(f"out= case {i}", buf.clone(), want)  # the buffer itself, no wait
        case = cases(self.P)[0]
        x = inputs_for(case, self.P, seed=510)[self.rank].to(self.device)
        shape = fu.simulate(inputs_for(case, self.P, seed=510), 0, **self.splits(case))[
            self.rank
        ].shape
        wrong = [
            ("dtype", torch.empty(shape, dtype=torch.float32, device=self.device), "dtype"),
            (
                "shape",
                torch.empty((shape[0] + 1, *shape[1:]), dtype=case.dtype, device=self.device),
                "shape",
            ),
            ("device", torch.empty(shape, dtype=case.dtype), "out is on cpu"),
            (
                "non-contiguous",
                torch.empty((*shape[:-1], 2 * shape[-1]), dtype=case.dtype, device=self.device)[
                    ..., ::2
                ],
                "not contiguous",
            ),
        ]
        for name, buf, needle in wrong:
            self.expect_refused(
                f"out= with a wrong {name}",
                lambda: self.group.all_to_all_single_4d(x, 0, "out", out=buf, **self.splits(case)),
                (needle,),
            )
        # x and out in one buffer, overlapping by one element.
        store = torch.empty(x.numel() + math.prod(shape), dtype=case.dtype, device=self.device)
        xv = store[: x.numel()].view(x.shape)
        xv.copy_(x)
        ov = store[x.numel() - 1 : x.numel() - 1 + math.prod(shape)].view(shape)
        self.expect_refused(
            "out= sharing bytes with x",
            lambda: (self.group.all_to_all_single_4d(xv, 0, "out", out=ov, **self.splits(case))),
            ("out overlaps x",),
        )
        grad_x = x.detach().clone().requires_grad_(True)
        self.expect_refused(
            "out= with an input that requires grad",
            lambda: (
                self.group.all_to_all_single_4d(
                    grad_x,
                    0,
                    "out",
                    out=torch.empty(shape, dtype=case.dtype, device=self.device),
                    **self.splits(case),
                )
            ),
            ("out=",),
        )
        self.passed.append("out=: bit-exact into the caller's buffer; wrong out refused")

    def check_streams(self) -> None:
        """Calls from two streams the caller does not order against each other, one rank late
        in turn (0.2 s of host time before its call), so a missing wait shows as stale data.
        (1) Two borrowed results in flight: the first used on a side stream, the other then on
        the caller's stream, which must still wait for its own transfer (each window has a
        storage of its own; c10d keys waits by storage). (2) One tag's owned calls, with and
        without out=, alternating between the two streams back to back: the group orders each
        call after the other stream's last one (a cached graph may have run there)."""
        case = cases(self.P)[0]
        main, side = torch.cuda.current_stream(self.device), torch.cuda.Stream(self.device)
        rounds = 2 * self.P
        xs = [inputs_for(case, self.P, seed=700 + i) for i in range(3 * rounds)]
        wants = [fu.simulate(x, 0, **self.splits(case))[self.rank] for x in xs]
        got = []
        for i in range(rounds):
            q = self.group.all_to_all_single_4d_borrowed(
                xs[2 * i][self.rank].to(self.device), 0, "streams-q", **self.splits(case)
            )
            if self.rank == i % self.P:
                time.sleep(0.2)
            k = self.group.all_to_all_single_4d_borrowed(
                xs[2 * i + 1][self.rank].to(self.device), 0, "streams-k", **self.splits(case)
            )
            with torch.cuda.stream(side):
                q_copy = q * 1  # q's first use, on the side stream
            k_copy = k * 1  # k's first use, on the caller's stream
            main.wait_stream(side)  # the side read before the next call with q's tag
            got.append((f"round {i}: borrowed q first used on a side stream", q_copy, 2 * i))
            got.append((f"round {i}: borrowed k then used on the caller's", k_copy, 2 * i + 1))
        for i in range(rounds):
            stream = main if i % 2 == 0 else side
            x_index = 2 * rounds + i
            with torch.cuda.stream(stream):
                x = xs[x_index][self.rank].to(self.device)
                if self.rank == i % self.P:
                    time.sleep(0.2)
                if i % 4 < 2:
                    out = torch.empty_like(wants[x_index], device=self.device)
                    y = self.group.all_to_all_single_4d(
                        x, 0, "streams-t", out=out, **self.splits(case)
                    )
                else:
                    y = self.group.all_to_all_single_4d(x, 0, "streams-t", **self.splits(case))
                kept = y * 1
            where = "main" if stream is main else "side"
            got.append((f"round {i}: owned call on the {where} stream", kept, x_index))
        torch.cuda.synchronize()
        for name, tensor, index in got:
            self.expect(name, tensor, wants[index])
        self.passed.append(
            f"two streams: {rounds} borrowed pairs used on different streams, {rounds} calls "
            "on one tag alternating streams"
        )

    def check_async_result(self) -> None:
        """Eager results with peers are AsyncCollectiveTensors (plain tensors at P = 1). Work
        queued on the caller's stream after the call runs while the transfer still waits for a
        late peer: each rank in turn calls 0.5 s (host time) after the others, and every other
        rank's kernel queued after the call completes while its call is still pending."""
        from torch.distributed._functional_collectives import AsyncCollectiveTensor

        case = cases(self.P)[0]
        xs = inputs_for(case, self.P, seed=601)
        want = fu.simulate(xs, 0, **self.splits(case))[self.rank]
        x = xs[self.rank].to(self.device)
        y = self.group.all_to_all_single_4d(x, 0, "acts", **self.splits(case))
        yb = self.group.all_to_all_single_4d_borrowed(x, 0, "acts-b", **self.splits(case))
        if self.P == 1:
            assert type(y) is torch.Tensor and type(yb) is torch.Tensor, (type(y), type(yb))
            self.expect("P = 1 result", y, want)
            self.passed.append("P = 1: plain tensors (nothing in flight)")
            return
        assert isinstance(y, AsyncCollectiveTensor), f"owned result is a {type(y).__name__}"
        assert isinstance(yb, AsyncCollectiveTensor), f"borrowed result is a {type(yb).__name__}"
        self.expect("owned async result", y, want)
        self.expect("borrowed async result", yb, want)
        side = torch.cuda.Stream(self.device)
        # Every kernel the loop launches, launched once first: with CUDA's lazy module loading
        # (torch's default) the first launch of a kernel may wait for the whole device, a
        # transfer that waits for a late peer included.
        (torch.ones(64, device=self.device) * 3).sum().item()
        with torch.cuda.stream(side):
            (y.wait() * 1).sum().item()
        torch.cuda.synchronize()
        overlapped = 0
        for late in range(self.P):
            dist.barrier()
            if self.rank == late:
                time.sleep(0.5)
            t0 = time.perf_counter()
            z = self.group.all_to_all_single_4d(x, 0, "acts", **self.splits(case))
            t1 = time.perf_counter()
            queued = torch.ones(64, device=self.device) * 3  # caller-stream work after the call
            after = torch.cuda.Event()
            after.record()
            with torch.cuda.stream(side):
                used = z * 1  # the first use: the side stream waits for the transfer
                done = torch.cuda.Event()
                done.record(side)
            t2 = time.perf_counter()
            after.synchronize()
            t3 = time.perf_counter()
            pending = not done.query()
            side.synchronize()
            self.expect("async result after a late peer", used, want)
            assert queued.sum().item() == 192
            if self.rank != late:
                assert pending, (
                    f"rank {self.rank}: the caller's next kernel waited for the transfer (rank "
                    f"{late} was late by 0.5 s); host ms: call {1e3 * (t1 - t0):.1f}, queue "
                    f"{1e3 * (t2 - t1):.1f}, caller-stream sync {1e3 * (t3 - t2):.1f}"
                )
                overlapped += 1
        self.passed.append(
            f"async results: caller-stream work ran beside {overlapped} pending transfers"
        )
