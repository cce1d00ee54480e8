"""torchrun worker: CUDA-graph capture of every fast-ulysses entry point, checked bit for bit.

    # P ranks sharing cuda:0 (gloo), the way tests/gpu/test_graph_gpu.py runs it
    FAST_ULYSSES_ALLOW_SHARED_GPU=1 torchrun --standalone --nproc-per-node 4 \
        tests/workers/graph_correctness.py --shared-gpu
    # a subset (check names or name prefixes; --list names them), fewer replays of the layer
    ... graph_correctness.py --shared-gpu --only captured_layer,capture_without --replays 50
    # a real node, one GPU per rank (NCCL process group)
    torchrun --standalone --nproc-per-node 8 tests/workers/graph_correctness.py

Every check builds its own UlyssesGroup (and destroys it), so `--only` runs any subset. A tag's
window exists before capture, by an eager warm-up call on a side stream or by `reserve()`
(both are used). Inputs are rebuilt on every rank from seeds (a2a_checks.inputs_for), so each
rank compares its results with `fast_ulysses.simulate` on the raw bytes.

Launched by multirank.py (as tests/gpu does), each rank also writes a JSON report naming
every check and how it ended. Rank 0 prints '  ok  <check>: ...' per check and a closing
'N passed, 0 failed' line. A failure
raises an AssertionError naming the check, the rank and the replay (or call) index, prints it
on stderr and ends the process with exit status 1 (os._exit: peers blocked on the GPU waiting
for this rank must not keep it alive), so torchrun stops the other ranks and exits non-zero.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import time
import traceback

import a2a_checks
import torch
import torch.distributed as dist
import torch.nn.functional as F
from a2a_checks import Case, balanced
from multirank import Report
from profiling import NOT_KERNELS, activities, device_activity, init_profiler_for_graphs

import fast_ulysses as fu

CHECKS: dict = {}  # name -> function, in run order


def check(fn):
    """Registers `fn` as the check named after it without its `check_` prefix."""
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="all ranks on cuda:0 over gloo (needs FAST_ULYSSES_ALLOW_SHARED_GPU=1)",
    )
    parser.add_argument(
        "--replays",
        type=int,
        default=200,
        help="replays of the captured layer (default 200); the other checks "
        "replay min(20, --replays) times",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="comma-separated check names or name prefixes (repeatable; --list "
        "names them); default: every check",
    )
    parser.add_argument(
        "--capture-error-mode",
        default="global",
        choices=("global", "thread_local", "relaxed"),
        help="torch.cuda.graph(capture_error_mode=...) (default: torch's, global)",
    )
    parser.add_argument(
        "--allow-compile-skip",
        action="store_true",
        help="compile_reduce_overhead: accept torch skipping cudagraphs for the "
        "copy entry point (results are still checked)",
    )
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    return parser.parse_args(argv)


# -- calls --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of an entry point. entry: copy (owned result), borrowed (barrier=True) or
    deferred (borrowed, barrier=False; `issue_all` adds the barrier()). consume: how an owned
    result is consumed, `clone` (read by an aten op) or `wait` (used as returned, or through
    .wait() where a group returns an AsyncCollectiveTensor)."""

    case: Case
    mode: int
    tag: str
    entry: str = "copy"
    consume: str = "clone"

    def splits(self) -> dict:
        return dict(
            seq_splits=list(self.case.seq_splits),
            head_splits=list(self.case.head_splits),
            layout=self.case.layout,
        )

    def shape(self, rank: int) -> tuple:
        if self.mode == 0:
            return self.case.input_shape(rank)
        c = self.case
        S, h = sum(c.seq_splits), c.head_splits[rank]
        return (c.batch, S, h, c.head_dim) if c.layout == "bshd" else (S, c.batch, h, c.head_dim)

    def spec(self, rank: int):
        return fu.CallSpec(
            shape=self.shape(rank),
            dtype=self.case.dtype,
            mode=self.mode,
            tag=self.tag,
            seq_splits=tuple(self.case.seq_splits),
            head_splits=tuple(self.case.head_splits),
            layout=self.case.layout,
        )

    def inputs(self, world_size: int, seed: int) -> list[torch.Tensor]:
        return a2a_checks.inputs_for(self.case, world_size, seed=seed, mode=self.mode)

    def want(self, xs: list[torch.Tensor], rank: int) -> torch.Tensor:
        return fu.simulate(xs, self.mode, **self.splits())[rank]

    def label(self) -> str:
        return f"{self.entry} mode {self.mode} tag {self.tag!r}"


def _wait(y: torch.Tensor) -> torch.Tensor:
    wait = getattr(y, "wait", None)
    return wait() if wait is not None else y


def issue(group, call: Call, x: torch.Tensor) -> torch.Tensor:
    if call.entry == "copy":
        y = group.all_to_all_single_4d(x, call.mode, call.tag, **call.splits())
        return _wait(y) if call.consume == "wait" else y.clone()
    return group.all_to_all_single_4d_borrowed(
        x, call.mode, call.tag, barrier=call.entry == "borrowed", **call.splits()
    )


def issue_all(group, calls, xs) -> list[torch.Tensor]:
    """The calls in order, then one barrier() if any was deferred."""
    outs = [issue(group, c, x) for c, x in zip(calls, xs)]
    if any(c.entry == "deferred" for c in calls):
        group.barrier()
    return outs


def keep(calls, outs) -> list[torch.Tensor]:
    """Stream-ordered copies of borrowed windows (valid only until the next call with the tag);
    owned results are already the caller's."""
    return [o if c.entry == "copy" else o.clone() for c, o in zip(calls, outs)]


def pick(P: int, layout: str, dtype: torch.dtype, batch: int = 1) -> Case:
    """The case of a2a_checks.cases with its uneven sequence and head splits (as uneven as P
    allows; from P = 4 on, rank 3 holds zero rows)."""
    seq = tuple((3 * i + 1) % 5 for i in range(P))
    seq = seq if sum(seq) else (3,) * P
    heads = balanced(2 * P + 1, P)
    for c in a2a_checks.cases(P):
        if (c.layout, c.dtype, c.batch, c.seq_splits, c.head_splits) == (
            layout,
            dtype,
            batch,
            seq,
            heads,
        ):
            return c
    return Case(batch, seq, heads, 64, dtype, layout)  # not in the matrix: the same case


# -- the context every check gets ---------------------------------------------------------------


class Ctx:
    def __init__(self, args, pg, rank: int, world_size: int, device: torch.device):
        self.args, self.pg, self.rank, self.P, self.device = args, pg, rank, world_size, device
        self.checker = a2a_checks.Checker(None, rank, world_size, device)
        self.check = ""
        self.where = "setup"

    @property
    def short(self) -> int:
        return max(1, min(20, self.args.replays))

    def expect(self, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        self.checker.expect(f"{self.check} [{self.where}] {what}", got, want)

    def group(self, pool_bytes: int = 1 << 22):
        return fu.UlyssesGroup(self.pg, pool_bytes)

    def graph(self):
        g = torch.cuda.CUDAGraph()
        return g, torch.cuda.graph(g, capture_error_mode=self.args.capture_error_mode)

    def capture_fn(self, fn, where: str = "capture"):
        """Captures fn() into a new graph (torch.cuda.graph captures on its own side stream);
        returns the graph and fn's outputs (static: every replay rewrites them)."""
        self.where = where
        g, capturing = self.graph()
        with capturing:
            outs = fn()
        return g, outs

    def capture(self, group, calls, statics):
        return self.capture_fn(lambda: issue_all(group, calls, statics))

    def warm_up(self, group, calls, seed: int) -> list[torch.Tensor]:
        """The calls once, eagerly, on a side stream (torch's rule before capture), results
        checked; returns the static inputs (this rank's inputs of that call, on the GPU)."""
        self.where = "warm-up"
        xss = [c.inputs(self.P, seed + j) for j, c in enumerate(calls)]
        statics = [xs[self.rank].to(self.device) for xs in xss]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            outs = keep(calls, issue_all(group, calls, statics))
        torch.cuda.current_stream().wait_stream(side)
        for c, o, xs in zip(calls, outs, xss):
            self.expect(f"{c.label()} (warm-up)", o, c.want(xs, self.rank))
        return statics

    def replay_and_check(
        self, g, calls, statics, outs, n: int, seed: int, chunk: int = 10, label: str = "replay"
    ) -> None:
        """n replays with fresh inputs copied into the static inputs before each (stream
        ordered), `chunk` replays issued back to back (results cloned on the stream), then
        every result of the chunk checked against simulate."""
        for start in range(0, n, chunk):
            batch = []
            for i in range(start, min(n, start + chunk)):
                xss = [c.inputs(self.P, seed + 1000 * i + j) for j, c in enumerate(calls)]
                batch.append((i, xss, [xs[self.rank].to(self.device) for xs in xss]))
            results = []
            for i, _, xdev in batch:
                self.where = f"{label} {i}"
                for s, x in zip(statics, xdev):
                    s.copy_(x)
                g.replay()
                results.append([o.clone() for o in outs])
            for (i, xss, _), got in zip(batch, results):
                self.where = f"{label} {i}"
                for c, o, xs in zip(calls, got, xss):
                    self.expect(c.label(), o, c.want(xs, self.rank))


def finish(group) -> None:
    """Waits for this rank's work, then destroys the group (collective)."""
    torch.cuda.synchronize()
    group.destroy()


# -- each entry point captured alone ------------------------------------------------------------


@check
def check_capture_copy_mode0(ctx: Ctx) -> str:
    """Owned result, mode 0, bshd bf16 uneven splits; window from an eager warm-up; the result
    consumed inside the graph by its first aten op."""
    group = ctx.group()
    calls = [Call(pick(ctx.P, "bshd", torch.bfloat16), 0, "copy0", "copy", "clone")]
    statics = ctx.warm_up(group, calls, seed=1_000)
    g, outs = ctx.capture(group, calls, statics)
    ctx.replay_and_check(g, calls, statics, outs, ctx.short, seed=1_100, chunk=5)
    finish(group)
    return f"{ctx.short} replays, warm-up window, {calls[0].case.seq_splits} rows"


@check
def check_capture_copy_mode1(ctx: Ctx) -> str:
    """Owned result, mode 1, sbhd fp16 uneven; the window sized by reserve() only (the warm-up
    runs on another declared tag, so the captured tag's first call is the captured one);
    used inside the graph as returned."""
    group = ctx.group(0)
    call = Call(pick(ctx.P, "sbhd", torch.float16), 1, "copy1", "copy", "wait")
    warm = dataclasses.replace(call, tag="warm")
    group.reserve([call.spec(ctx.rank), warm.spec(ctx.rank)])
    statics = ctx.warm_up(group, [warm], seed=2_000)
    g, outs = ctx.capture(group, [call], statics)
    ctx.replay_and_check(g, [call], statics, outs, ctx.short, seed=2_100, chunk=5)
    finish(group)
    return f"{ctx.short} replays, reserve() window"


@check
def check_capture_borrowed(ctx: Ctx) -> str:
    """Borrowed (barrier=True), mode 0, sbhd bf16 b=2 uneven; the graph's output is the
    window itself, read after each replay."""
    group = ctx.group()
    calls = [Call(pick(ctx.P, "sbhd", torch.bfloat16, batch=2), 0, "borrowed", "borrowed")]
    statics = ctx.warm_up(group, calls, seed=3_000)
    g, outs = ctx.capture(group, calls, statics)
    ctx.replay_and_check(g, calls, statics, outs, ctx.short, seed=3_100, chunk=5)
    finish(group)
    return f"{ctx.short} replays, warm-up window"


@check
def check_capture_deferred_qkv(ctx: Ctx) -> str:
    """q, k, v borrowed with barrier=False then one barrier(), all captured; bshd fp16
    uneven; windows from reserve()."""
    group = ctx.group(0)
    case = pick(ctx.P, "bshd", torch.float16)
    calls = [Call(case, 0, t, "deferred") for t in ("q", "k", "v")]
    warm = [dataclasses.replace(c, tag=f"warm-{c.tag}") for c in calls]
    group.reserve([c.spec(ctx.rank) for c in calls + warm])
    statics = ctx.warm_up(group, warm, seed=4_000)
    g, outs = ctx.capture(group, calls, statics)
    ctx.replay_and_check(g, calls, statics, outs, ctx.short, seed=4_100, chunk=5)
    finish(group)
    return f"{ctx.short} replays of q, k, v (barrier=False) + barrier(), reserve() windows"


@check
def check_eager_result_read_in_capture(ctx: Ctx) -> str:
    """An eager owned call's result, never waited on, first read inside a capture (its deferred
    wait runs there: the device is past the call after torch.cuda.graph's synchronize, and the
    capture must stay valid); then a borrowed call captured right after an eager borrowed call on
    its tag whose wait was left to its result (the eager call's work on the communication stream
    must not become a dependency of the capture). Both graphs replayed."""
    group = ctx.group()
    owned = Call(pick(ctx.P, "bshd", torch.bfloat16), 0, "eager-owned", "copy", "wait")
    xs = owned.inputs(ctx.P, seed=5_000)
    ctx.where = "eager call"
    y = group.all_to_all_single_4d(
        xs[ctx.rank].to(ctx.device), owned.mode, owned.tag, **owned.splits()
    )
    g, (read,) = ctx.capture_fn(lambda: [y * 1])  # y's first use: its wait runs under capture
    for i in range(2):
        ctx.where = f"replay {i}"
        g.replay()
        ctx.expect("eager owned result read in the graph", read, owned.want(xs, ctx.rank))
    borrowed = Call(pick(ctx.P, "sbhd", torch.float16), 0, "eager-borrowed", "borrowed")
    statics = ctx.warm_up(group, [borrowed], seed=5_100)  # eager, its wait left to the result
    g2, outs = ctx.capture(group, [borrowed], statics)
    ctx.replay_and_check(g2, [borrowed], statics, outs, ctx.short, seed=5_200, chunk=5)
    finish(group)
    return f"2 replays reading the eager result, {ctx.short} of the borrowed call"


@check
def check_eager_result_unused_across_replay(ctx: Ctx) -> str:
    """Once a group has captured a call, its eager results are plain tensors joined into the
    caller's stream (at P > 1 they were AsyncCollectiveTensors before the capture): an eager
    call on the graph's tag whose result is not used before the next replay, then the replay,
    then both results checked, again and again with no host synchronize."""
    group = ctx.group()
    call = Call(pick(ctx.P, "bshd", torch.bfloat16), 0, "x", "copy", "wait")
    statics = ctx.warm_up(group, [call], seed=6_000)
    g, (out,) = ctx.capture(group, [call], statics)
    n = ctx.short
    issued = []
    for i in range(n):
        ctx.where = f"iteration {i}"
        ex, gx = call.inputs(ctx.P, 6_100 + i), call.inputs(ctx.P, 6_500 + i)
        y = group.all_to_all_single_4d(
            ex[ctx.rank].to(ctx.device), call.mode, call.tag, **call.splits()
        )
        if type(y) is not torch.Tensor:
            raise AssertionError(
                f"{ctx.check} [{ctx.where}]: an eager call on a group with a captured graph "
                f"returned {type(y).__name__}, not a plain tensor joined into its stream"
            )
        statics[0].copy_(gx[ctx.rank].to(ctx.device))
        g.replay()
        issued.append((i, ex, y, gx, out.clone()))
    for i, ex, y, gx, got in issued:
        ctx.where = f"iteration {i}"
        ctx.expect("eager result, used after the replay", y, call.want(ex, ctx.rank))
        ctx.expect("replay result", got, call.want(gx, ctx.rank))
    finish(group)
    return f"{n} eager calls, each result used only after the next replay"


@check
def check_captured_barrier_after_eager_deferred_raises(ctx: Ctx) -> str:
    """barrier() captured while a tag has an eager barrier=False call not yet closed raises
    ValueError naming the tag (a replayed barrier would not wait for that call's transfer);
    torch ends the capture, an eager barrier() closes the call, whose result is then checked."""
    group = ctx.group()
    call = Call(pick(ctx.P, "bshd", torch.float16), 0, "open-q", "deferred")
    xs = call.inputs(ctx.P, seed=8_500)
    ctx.where = "eager barrier=False call"
    q = group.all_to_all_single_4d_borrowed(
        xs[ctx.rank].to(ctx.device), call.mode, call.tag, barrier=False, **call.splits()
    )
    try:
        ctx.capture_fn(group.barrier, where="capture of barrier()")
    except ValueError as error:
        assert "'open-q'" in str(error) and "before capturing" in str(error), (
            f"rank {ctx.rank}: {ctx.check}: the ValueError does not name the tag and the fix: "
            f"{error}"
        )
    else:
        raise AssertionError(
            f"rank {ctx.rank}: {ctx.check}: barrier() captured after an eager barrier=False call "
            "did not raise"
        )
    ctx.where = "eager barrier() after the refused capture"
    group.barrier()
    ctx.expect("the barrier=False result after an eager barrier()", q, call.want(xs, ctx.rank))
    finish(group)
    return "refused with the tag named; the eager barrier() closed the call"


# -- a captured layer ---------------------------------------------------------------------------


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA on bshd tensors: (b, S, h, d) -> (b, S, h, d), contiguous."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return o.transpose(1, 2).contiguous()


@check
def check_captured_layer(ctx: Ctx) -> str:
    """q, k, v mode 0 borrowed barrier=False, barrier(), SDPA, o mode 1 (owned), captured and
    replayed --replays times with fresh inputs. Every replay: q, k, v (cloned inside the graph)
    vs simulate; o vs SDPA run eagerly on simulate's q, k, v of every rank, then simulate."""
    P, rank, device = ctx.P, ctx.rank, ctx.device
    seq = tuple(8 + (5 * r) % 9 for r in range(P))  # 8..16 rows per rank, uneven
    case = Case(1, seq, balanced(2 * P + 1, P), 64, torch.bfloat16, "bshd")
    qkv = [Call(case, 0, t, "deferred") for t in ("q", "k", "v")]
    o_call = Call(case, 1, "o", "copy", "clone")
    group = ctx.group()

    def layer(xq, xk, xv):
        q, k, v = issue_all(group, qkv, [xq, xk, xv])
        kept = [q.clone(), k.clone(), v.clone()]
        return kept + [issue(group, o_call, attention(q, k, v))]

    def reference(xss):
        w = [fu.simulate(xs, 0, **o_call.splits()) for xs in xss]  # every rank's q, k, v
        attn = [attention(*(w[j][r].to(device) for j in range(3))).cpu() for r in range(P)]
        return [w[j][rank] for j in range(3)] + [fu.simulate(attn, 1, **o_call.splits())[rank]]

    def inputs(seed):
        return [c.inputs(P, seed + j) for j, c in enumerate(qkv)]

    ctx.where = "warm-up"
    xss = inputs(5_000)
    statics = [xs[rank].to(device) for xs in xss]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = layer(*statics)
    torch.cuda.current_stream().wait_stream(side)
    names = ("q", "k", "v", "o")
    for name, o, w in zip(names, got, reference(xss)):
        ctx.expect(name, o, w)
    del got

    g, outs = ctx.capture_fn(lambda: layer(*statics))

    n, chunk = ctx.args.replays, 50
    for start in range(0, n, chunk):
        batch = []
        for i in range(start, min(n, start + chunk)):
            xss = inputs(6_000 + 10 * i)
            batch.append((i, xss, [xs[rank].to(device) for xs in xss]))
        results = []
        for i, _, xdev in batch:
            ctx.where = f"replay {i}"
            for s, x in zip(statics, xdev):
                s.copy_(x)
            g.replay()
            results.append([o.clone() for o in outs])
        for (i, xss, _), got in zip(batch, results):
            ctx.where = f"replay {i}"
            for name, o, w in zip(names, got, reference(xss)):
                ctx.expect(name, o, w)
    finish(group)
    return (
        f"{n} replays, seq_splits {seq}, head_splits {case.head_splits}, bf16 d=64; "
        "q, k, v and o bit-exact every replay"
    )


# -- eager calls between replays on the graph's tags --------------------------------------------


@check
def check_eager_between_replays(ctx: Ctx) -> str:
    """A graph (copy mode 0 on tag x, borrowed mode 1 on tag y) and eager calls on the same
    tags (copy consumed by wait or clone; borrowed with barrier=True or barrier=False +
    barrier()), eager before or after the replay in turn, all issued back to back without a
    host synchronize, then every graph and eager result checked."""
    P, rank, device = ctx.P, ctx.rank, ctx.device
    case = pick(P, "bshd", torch.bfloat16)
    graph_calls = [Call(case, 0, "x", "copy", "clone"), Call(case, 1, "y", "borrowed")]
    group = ctx.group()
    statics = ctx.warm_up(group, graph_calls, seed=7_000)
    g, outs = ctx.capture(group, graph_calls, statics)

    n = ctx.short
    plan = []
    for i in range(n):
        eager_calls = [
            dataclasses.replace(graph_calls[0], consume="wait" if i % 2 else "clone"),
            dataclasses.replace(graph_calls[1], entry="deferred" if i % 3 == 2 else "borrowed"),
        ]
        gx = [c.inputs(P, 7_100 + 1000 * i + j) for j, c in enumerate(graph_calls)]
        ex = [c.inputs(P, 7_500 + 1000 * i + j) for j, c in enumerate(eager_calls)]
        plan.append(
            (
                i,
                eager_calls,
                gx,
                [xs[rank].to(device) for xs in gx],
                ex,
                [xs[rank].to(device) for xs in ex],
            )
        )
    issued = []
    for i, eager_calls, _, gdev, _, edev in plan:
        ctx.where = f"iteration {i}"

        def replay():
            for s, x in zip(statics, gdev):
                s.copy_(x)
            g.replay()
            return [o.clone() for o in outs]

        def eager():
            return keep(eager_calls, issue_all(group, eager_calls, edev))

        if i % 2 == 0:
            got_g = replay()
            got_e = eager()
        else:
            got_e = eager()
            got_g = replay()
        issued.append((got_g, got_e))
    for (i, eager_calls, gx, _, ex, _), (got_g, got_e) in zip(plan, issued):
        ctx.where = f"replay {i} ({'before' if i % 2 == 0 else 'after'} the eager calls)"
        for c, o, xs in zip(graph_calls, got_g, gx):
            ctx.expect(c.label(), o, c.want(xs, rank))
        ctx.where = f"eager call {i}"
        for c, o, xs in zip(eager_calls, got_e, ex):
            ctx.expect(c.label(), o, c.want(xs, rank))
    finish(group)
    return f"{n} replays interleaved with {2 * n} eager calls on the same tags"


@check
def check_first_owned_call_after_capture(ctx: Ctx) -> str:
    """A tag that has carried only borrowed calls (eager calls there skip the waits for owned
    results): a borrowed call on it captured into a graph, then the tag's first owned calls
    interleaved with replays of that graph and with eager borrowed calls at the address of one
    made before the first owned call, back to back without a host synchronize; every result
    checked. With the eager-graph cache on (P > 1), that eager borrowed call must get a graph
    of its own after the tag's first owned call instead of the one made before it, which does
    not wait for the peers' copies of their owned results out of their windows."""
    P, rank, device = ctx.P, ctx.rank, ctx.device
    case = pick(P, "bshd", torch.bfloat16, batch=2)
    borrowed = Call(case, 0, "first", "borrowed")
    owned = dataclasses.replace(borrowed, entry="copy", consume="wait")
    group = ctx.group()
    statics = ctx.warm_up(group, [borrowed], seed=7_800)
    eager_x = statics[0].clone()  # the eager borrowed calls' input: one address throughout

    def eager(call, x, seed):
        xss = call.inputs(P, seed)
        return keep([call], [issue(group, call, x.copy_(xss[rank].to(device)))])[0], xss

    ctx.where = "eager borrowed calls before any owned call"
    first = [eager(borrowed, eager_x, 7_810 + i) for i in range(2)]
    cached = group.stats()["graphs_cached"]
    g, outs = ctx.capture(group, [borrowed], statics)

    n = ctx.short
    owned_x = torch.empty_like(statics[0])
    results = []
    for i in range(n):
        ctx.where = f"iteration {i}"
        got_o = eager(owned, owned_x, 7_900 + 10 * i)
        gx = borrowed.inputs(P, 7_901 + 10 * i)
        statics[0].copy_(gx[rank].to(device))
        g.replay()
        got_g = (outs[0].clone(), gx)
        got_b = eager(borrowed, eager_x, 7_902 + 10 * i)
        results.append((got_o, got_g, got_b))
        if i == 0 and P > 1 and group.stats()["graph_calls"] > 0:
            # the owned call's graph and the borrowed call's second one (its first one, made
            # before the owned call, must not be launched again)
            new = group.stats()["graphs_cached"] - cached
            assert new == 2, (
                f"rank {rank}: {new} graphs cached by the tag's first owned call "
                f"and the eager borrowed call after it, expected 2"
            )
    for i, (done, xss) in enumerate(first):
        ctx.where = f"eager borrowed call {i} before the first owned call"
        ctx.expect(borrowed.label(), done, borrowed.want(xss, rank))
    for i, row in enumerate(results):
        for what, (got, xss), call in zip(
            ("owned call", "replay", "eager borrowed call"), row, (owned, borrowed, borrowed)
        ):
            ctx.where = f"{what} {i}"
            ctx.expect(call.label(), got, call.want(xss, rank))
    finish(group)
    return (
        f"{n} owned calls, {n} replays and {n} borrowed calls on a tag first used only by "
        f"borrowed calls"
    )


# -- two graphs, one group, the same tags -------------------------------------------------------


@check
def check_two_graphs_one_group(ctx: Ctx) -> str:
    """G1 (copy mode 0 on x, borrowed mode 1 on y, b=1) and G2 (borrowed mode 0 on x,
    copy mode 1 on y, b=2: larger) on one group; windows from reserve() over both shapes;
    replayed alternately (then a few repeats), back to back, every replay checked."""
    P, rank = ctx.P, ctx.rank
    small = pick(P, "bshd", torch.bfloat16, batch=1)
    large = dataclasses.replace(small, batch=2)
    g1_calls = [Call(small, 0, "x", "copy", "clone"), Call(small, 1, "y", "borrowed")]
    g2_calls = [Call(large, 0, "x", "borrowed"), Call(large, 1, "y", "copy", "wait")]
    warm1 = [dataclasses.replace(c, tag=f"warm-{c.tag}") for c in g1_calls]
    warm2 = [dataclasses.replace(c, tag=f"warm-{c.tag}") for c in g2_calls]
    group = ctx.group(0)
    group.reserve([c.spec(rank) for c in g1_calls + g2_calls + warm1 + warm2])
    statics1 = ctx.warm_up(group, warm1, seed=8_000)
    statics2 = ctx.warm_up(group, warm2, seed=8_100)
    g1, outs1 = ctx.capture(group, g1_calls, statics1)
    g2, outs2 = ctx.capture(group, g2_calls, statics2)
    graphs = {1: (g1, g1_calls, statics1, outs1), 2: (g2, g2_calls, statics2, outs2)}

    n = ctx.short
    order = [1 + i % 2 for i in range(2 * n)] + [2, 2, 1, 1, 2, 1, 1, 2]
    for start in range(0, len(order), 20):
        batch = []
        for i in range(start, min(len(order), start + 20)):
            _, calls, _, _ = graphs[order[i]]
            xss = [c.inputs(P, 8_200 + 1000 * i + j) for j, c in enumerate(calls)]
            batch.append((i, xss, [xs[rank].to(ctx.device) for xs in xss]))
        results = []
        for i, _, xdev in batch:
            g, _, statics, outs = graphs[order[i]]
            ctx.where = f"replay {i} (G{order[i]})"
            for s, x in zip(statics, xdev):
                s.copy_(x)
            g.replay()
            results.append([o.clone() for o in outs])
        for (i, xss, _), got in zip(batch, results):
            _, calls, _, _ = graphs[order[i]]
            ctx.where = f"replay {i} (G{order[i]})"
            for c, o, xs in zip(calls, got, xss):
                ctx.expect(c.label(), o, c.want(xs, rank))
    del graphs
    finish(group)
    return f"{len(order)} replays of two graphs on tags x, y (b=1 and b=2)"


# -- a call under capture without a window ------------------------------------------------------


@check
def check_capture_without_window_raises(ctx: Ctx) -> str:
    """Under capture, a call on a tag with no window, or with a window too small, raises
    ValueError naming reserve() and warm-up; torch ends the capture and the process goes on:
    eager calls, a valid capture and its replays, then an eager call that grows the pool, and
    the graph replayed again, all checked."""
    P, rank, device = ctx.P, ctx.rank, ctx.device
    case = pick(P, "bshd", torch.bfloat16)
    known = Call(case, 0, "known", "copy", "clone")
    group = ctx.group(0)
    statics = ctx.warm_up(group, [known], seed=9_000)
    x = statics[0]
    big_case = dataclasses.replace(case, batch=4)
    big = Call(big_case, 0, "known").inputs(P, 9_001)[rank].to(device)
    attempts = [
        (
            "copy on a tag with no window",
            lambda: _wait(group.all_to_all_single_4d(x, 0, "new", **known.splits())),
        ),
        (
            "borrowed on a tag with no window",
            lambda: group.all_to_all_single_4d_borrowed(x, 0, "new-b", **known.splits()),
        ),
        (
            "borrowed barrier=False on a tag with no window",
            lambda: group.all_to_all_single_4d_borrowed(
                x, 0, "new-d", barrier=False, **known.splits()
            ),
        ),
        (
            "copy needing a larger window (b=4 on a b=1 window)",
            lambda: _wait(group.all_to_all_single_4d(big, 0, "known", **known.splits())),
        ),
    ]
    count = 0
    for name, call in attempts:
        try:
            ctx.capture_fn(call, where=f"capture of '{name}'")
        except ValueError as error:
            message = str(error)
            assert "reserve()" in message and "warm-up" in message, (
                f"rank {rank}: {ctx.check}: {name}: ValueError lacks 'reserve()'/'warm-up': "
                f"{message}"
            )
        else:
            raise AssertionError(
                f"rank {rank}: {ctx.check}: {name} under capture did not raise ValueError"
            )
        assert not torch.cuda.is_current_stream_capturing(), (
            f"rank {rank}: {ctx.check}: still capturing after '{name}' raised"
        )
        ctx.where = f"eager call after '{name}'"
        xs = known.inputs(P, 9_100 + count)
        ctx.expect(known.label(), issue(group, known, xs[rank].to(device)), known.want(xs, rank))
        count += 1

    g, outs = ctx.capture(group, [known], statics)
    ctx.replay_and_check(g, [known], statics, outs, 3, seed=9_200, label="valid replay")
    ctx.where = "eager call on a new tag after capture (the pool grows)"
    grow = Call(Case(4, (64,) * P, (2,) * P, 64, torch.bfloat16, "bshd"), 0, "grow", "borrowed")
    xs = grow.inputs(P, 9_300)
    segments_before = _segments(group)
    ctx.expect(grow.label(), issue(group, grow, xs[rank].to(device)), grow.want(xs, rank))
    segments = f"pool segments {segments_before} -> {_segments(group)}"
    ctx.replay_and_check(
        g, [known], statics, outs, 3, seed=9_400, label="replay after the pool grew"
    )
    ctx.where = "eager call after the replays"
    xs = known.inputs(P, 9_500)
    ctx.expect(known.label(), issue(group, known, xs[rank].to(device)), known.want(xs, rank))
    finish(group)
    return (
        f"{len(attempts)} calls under capture raised ValueError (reserve(), warm-up); "
        f"eager calls, a valid capture, a new tag ({segments}) and replays after it correct"
    )


def _segments(group):
    stats = getattr(group, "stats", None)
    return stats()["segments"] if stats is not None else "?"


# -- torch.compile(mode="reduce-overhead") ------------------------------------------------------


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage().splitlines()[0][:300])


@check
def check_compile_reduce_overhead(ctx: Ctx) -> str:
    """torch.compile(mode='reduce-overhead', fullgraph=True) of `all_to_all_single_4d(x) * 2 + 1`,
    10 calls with fresh inputs, each checked; then the same with the borrowed entry point,
    whose outcome (cudagraphs used, skipped, or a compile error) is reported."""
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    P, rank, device = ctx.P, ctx.rank, ctx.device
    inductor_config.compile_threads = 1  # P processes compile at once: no worker pools
    case = pick(P, "bshd", torch.bfloat16)
    sp = Call(case, 0, "compiled").splits()
    group = ctx.group()

    def step_copy(x):
        return group.all_to_all_single_4d(x, 0, "copy", **sp) * 2 + 1

    def step_borrowed(x):
        return group.all_to_all_single_4d_borrowed(x, 0, "borrowed", **sp) * 2 + 1

    collect = _Collect()
    # torch's "skipping cudagraphs due to ..." warnings (an artifact logger, off by default)
    loggers = [logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs")]
    for logger in loggers:
        logger.addHandler(collect)
    report = []
    try:
        for variant, fn in (("copy", step_copy), ("borrowed", step_borrowed)):
            skips_before = counters["inductor"]["cudagraph_skips"]
            first_message = len(collect.messages)
            compiled = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
            error = None
            calls = 10
            for i in range(calls):
                ctx.where = f"{variant} compiled call {i}"
                xs = a2a_checks.inputs_for(case, P, seed=10_000 + 100 * len(report) + i)
                want = fu.simulate(xs, 0, **sp)[rank] * 2 + 1
                torch.compiler.cudagraph_mark_step_begin()
                try:
                    got = compiled(xs[rank].to(device)).cpu()
                except Exception as exc:  # noqa: BLE001
                    if variant == "copy" or i > 0:
                        raise
                    error = exc  # the borrowed variant may be refused by torch.compile: report
                    break
                ctx.expect(f"{variant}: compiled all_to_all * 2 + 1", got, want)
                del got
            skipped = counters["inductor"]["cudagraph_skips"] - skips_before
            messages = collect.messages[first_message:]
            if error is not None:
                outcome = (
                    f"{variant}: torch.compile raised {type(error).__name__}: "
                    f"{str(error).splitlines()[0][:200]} (reported, not a failure)"
                )
            elif skipped:
                outcome = (
                    f"{variant}: cudagraphs SKIPPED ({skipped}x: "
                    f"{'; '.join(messages) or 'no message'}), {calls} results correct"
                )
                if variant == "copy" and not ctx.args.allow_compile_skip:
                    raise AssertionError(
                        f"rank {rank}: {ctx.check}: torch skipped cudagraphs for the copy entry "
                        f"point ({'; '.join(messages) or 'no message'}): nothing was captured "
                        "(--allow-compile-skip accepts this)"
                    )
            else:
                outcome = f"{variant}: cudagraphs used, {calls} results correct"
            report.append(outcome)
            del compiled
            torch._dynamo.reset()
    finally:
        for logger in loggers:
            logger.removeHandler(collect)
    try:
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()
    except Exception:  # noqa: BLE001 - private API, best effort
        pass
    finish(group)
    return "; ".join(report)


# -- zero SM ------------------------------------------------------------------------------------


@check
def check_zero_sm_kernels(ctx: Ctx) -> str:
    """torch.profiler (CPU + CUDA) around 20 eager borrowed calls and 20 replays of a graph of
    q, k, v borrowed barrier=False + barrier(): the only kernels are copy kernels (torch's
    elementwise copy for the own share), at most one per call; memcpys and memops are not
    kernels. Kernel names and counts printed by rank 0."""
    from collections import Counter

    P, rank = ctx.P, ctx.rank
    case = pick(P, "bshd", torch.bfloat16)
    eager = Call(case, 0, "eager", "borrowed")
    graph_calls = [Call(case, 0, t, "deferred") for t in ("q", "k", "v")]
    group = ctx.group()
    x_eager = ctx.warm_up(group, [eager], seed=11_000)[0]
    statics = ctx.warm_up(group, graph_calls, seed=11_100)
    g, outs = ctx.capture(group, graph_calls, statics)
    ctx.replay_and_check(g, graph_calls, statics, outs, 2, seed=11_200, label="replay")
    xss = [c.inputs(P, 11_300 + j) for j, c in enumerate(graph_calls)]
    for s, xs in zip(statics, xss):
        s.copy_(xs[rank])
    xs_eager = eager.inputs(P, 11_400)
    x_eager.copy_(xs_eager[rank])
    torch.cuda.synchronize()

    n = 20
    ctx.where = "profiled calls"
    # Rank 0 alone profiles (profiling.py says why); the others make the same calls unprofiled.
    profiling = (
        torch.profiler.profile(activities=activities()) if rank == 0 else contextlib.nullcontext()
    )
    with profiling as prof:
        for _ in range(n):
            window = issue(group, eager, x_eager)
        for _ in range(n):
            g.replay()
        torch.cuda.synchronize()
    calls = n + n * len(graph_calls)
    ctx.where = "after the profiled calls"
    ctx.expect(eager.label(), window, eager.want(xs_eager, rank))
    for c, o, xs in zip(graph_calls, outs, xss):
        ctx.expect(c.label(), o, c.want(xs, rank))

    if rank != 0:
        finish(group)
        return "census on rank 0"
    names = device_activity(prof)
    kernels = Counter(nm for nm in names if not nm.startswith(NOT_KERNELS))
    other = Counter(nm for nm in names if nm.startswith(NOT_KERNELS))
    not_copy = {nm: k for nm, k in kernels.items() if "copy" not in nm.lower()}
    n_kernels = sum(kernels.values())
    summary = [
        f"{calls} calls ({n} eager borrowed, {n} replays x 3): {n_kernels} kernels, "
        f"{sum(other.values())} memcpy/memset/other device activities"
    ]
    summary += [f"      kernel {k:4d} x {nm[:160]}" for nm, k in kernels.most_common()]
    summary += [f"      other  {k:4d} x {nm[:160]}" for nm, k in other.most_common()]
    ctx.where = "kernel census"
    assert names, (
        f"rank {rank}: {ctx.check}: the profiler recorded no device activity at all "
        "(not even the copies): the census would prove nothing"
    )
    assert not not_copy, (
        f"rank {rank}: {ctx.check}: kernels other than copies were launched: {dict(not_copy)}"
    )
    assert n_kernels <= calls, (
        f"rank {rank}: {ctx.check}: {n_kernels} copy kernels for "
        f"{calls} calls (more than one per call): {dict(kernels)}"
    )
    finish(group)
    return "\n".join(summary)


# -- main ---------------------------------------------------------------------------------------


def select(only: list[str]) -> list[str]:
    """The names of the checks `--only` picks (each word a check name or a name prefix), in run
    order; every check without `--only`. Raises SystemExit for a word that names none."""
    if not only:
        return list(CHECKS)
    wanted = [w.strip() for item in only for w in item.split(",") if w.strip()]
    chosen = [name for name in CHECKS if any(name.startswith(w) for w in wanted)]
    unknown = [w for w in wanted if not any(name.startswith(w) for name in CHECKS)]
    if unknown or not chosen:
        raise SystemExit(
            f"--only {','.join(wanted)}: unknown {unknown}; checks: {', '.join(CHECKS)}"
        )
    return chosen


def main(args) -> int:
    chosen = select(args.only)
    backend = "gloo" if args.shared_gpu else "nccl"
    dist.init_process_group(backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", 0 if args.shared_gpu else local_rank)
    torch.cuda.set_device(device)
    if "zero_sm_kernels" in chosen:
        init_profiler_for_graphs(device)
    ctx = Ctx(args, dist.group.WORLD, rank, world_size, device)

    start = time.time()
    report = Report(rank)
    passed = 0
    for name in chosen:
        fn = CHECKS[name]
        ctx.check, ctx.where = name, "setup"
        t0 = time.time()
        with report.check(name) as entry:
            try:
                note = fn(ctx)
                torch.cuda.synchronize()
            except Exception as error:
                raise AssertionError(
                    f"check {name} failed on rank {rank} at "
                    f"{ctx.where}: {type(error).__name__}: {error}"
                ) from error
            entry["detail"] = (note or "").split("\n")[0]
            dist.barrier()
        passed += 1
        if rank == 0:
            first, *rest = (note or "").split("\n")
            print(f"  ok  {name}: {first} ({time.time() - t0:.1f} s)", flush=True)
            for line in rest:
                print(line, flush=True)
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        print(
            f"P={world_size} ({'ranks share one GPU' if args.shared_gpu else backend}), "
            f"{time.time() - start:.1f} s, capture_error_mode={args.capture_error_mode}, "
            f"layer replays={args.replays}",
            flush=True,
        )
        print(f"{passed} passed, 0 failed", flush=True)
    report.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.list:
        for check_name, check_fn in CHECKS.items():
            print(f"{check_name}: {check_fn.__doc__.split(chr(10))[0]}")
        sys.exit(0)
    try:
        code = main(arguments)
    except BaseException:  # noqa: BLE001 - report, then leave without waiting on peers
        rank_text = os.environ.get("RANK", "?")
        text = traceback.format_exc()
        sys.stderr.write(f"[rank {rank_text}] FAILED\n{text}")
        sys.stderr.flush()
        last = text.strip().splitlines()[-1]
        sys.stdout.write(f"FAILED [rank {rank_text}] {last}\n")
        sys.stdout.flush()
        os._exit(1)
    sys.exit(code)
