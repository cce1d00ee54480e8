"""GPU tests of the fast path: P = 1..8 ranks sharing this machine's first GPU over gloo
(FAST_ULYSSES_ALLOW_SHARED_GPU=1), each run once as the worker tests/workers/a2a_correctness.py
through the launch_ranks fixture, with one test per check and P. They skip, saying why, where no
GPU is visible."""

from __future__ import annotations

import os
import re

import a2a_correctness
import pytest
import torch
from _gpu import needs_gpu

NPROCS = (1, 2, 3, 4, 5, 8)
TIMEOUT_S = 480  # bounds a hang; every P should take well under it
# Back-to-back calls per P (FAST_ULYSSES_GPU_ITERATIONS: fewer for a quick run on a time budget).
ITERATIONS = os.environ.get("FAST_ULYSSES_GPU_ITERATIONS", "1000")


def a2a(launch_ranks, nproc):
    return launch_ranks(
        "a2a_correctness", nproc, "--iterations", ITERATIONS, timeout=TIMEOUT_S, shared_gpu=True
    )


@needs_gpu
@pytest.mark.parametrize(
    "nproc,check", [(n, c) for n in NPROCS for c in a2a_correctness.check_names(n)]
)
def test_a2a_check(launch_ranks, nproc, check):
    a2a(launch_ranks, nproc).assert_check(check)


@needs_gpu
@pytest.mark.parametrize("nproc", NPROCS)
def test_a2a_run_ends_cleanly(launch_ranks, nproc):
    """Every rank exits 0 after all its checks, and rank 0 prints the standalone summary."""
    run = a2a(launch_ranks, nproc)
    run.assert_clean_exit()
    assert run.check_names() == a2a_correctness.check_names(nproc), run.describe()
    n = len(a2a_correctness.check_names(nproc))
    assert re.search(rf"^{n} passed, 0 failed$", run.ranks[0].output, re.MULTILINE), run.describe()
    for r in run.ranks:  # the worker exits with a group never destroyed, a result never used
        assert "unwaited" not in r.output, (
            f"rank {r.rank} warned of unwaited work:\n" + run.describe()
        )
    print(run.ranks[0].output)


@needs_gpu
def test_compile_traces_the_op(world1):
    """torch.compile traces the registered op through its Meta kernel (P = 1, in process)."""
    import fast_ulysses as fu

    group = fu.UlyssesGroup(world1, 1 << 20)
    try:
        x = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16, device="cuda")

        def step(t):
            return group.all_to_all_single_4d(t, 0, "compiled") * 2

        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        got = compiled(x)
        want = fu.simulate([x.cpu()], 0)[0] * 2
        assert torch.equal(got.cpu(), want)
    finally:
        group.destroy()


@needs_gpu
def test_a_reserve_refused_at_the_tag_limit_declares_no_tag(world1):
    """UlyssesGroup's reserve() that would pass the tag limit keeps none of its tags and seals
    nothing, as TorchUlyssesGroup's (P = 1, in process)."""
    import fast_ulysses as fu
    from fast_ulysses.plan import limits

    group = fu.UlyssesGroup(world1, 1 << 20)
    try:
        x = torch.ones(1, 1, 1, 8, device="cuda")
        limit = limits()["max_tags"]
        for k in range(limit - 6):
            group.all_to_all_single_4d(x, 0, f"t{k}")
        declared = [fu.CallSpec((1, 1, 1, 8), torch.float32, 0, f"r{k}") for k in range(10)]
        with pytest.raises(ValueError, match=f"would be the group's tag number {limit + 1}"):
            group.reserve(declared)
        stats = group.stats()
        assert stats["tags"] == limit - 6 and not stats["sealed"], stats
        group.all_to_all_single_4d(x, 0, "new")  # a slot the refused reserve() did not take
        group.reserve(declared[:5])
        stats = group.stats()
        assert stats["tags"] == limit and stats["sealed"], stats
    finally:
        group.destroy()


@needs_gpu
def test_watchdog_abort_ends_a_hung_job(launch_ranks):
    """A rank that never calls: with FAST_ULYSSES_WATCHDOG_ACTION=abort (the default) its peer's
    watchdog reports on stderr and ends its own process non-zero, while the other rank is still
    asleep (60 s) and has to be killed by the launcher: the job would otherwise hang."""
    env = {"FAST_ULYSSES_WATCHDOG_S": "3", "FAST_ULYSSES_WATCHDOG_ACTION": None}
    run = launch_ranks("watchdog_abort", 2, timeout=120, shared_gpu=True, env=env)
    caller, sleeper = run.ranks
    assert "rank 0: issuing at" in caller.output, run.describe()
    assert caller.returncode not in (None, 0), f"the hung call did not end rank 0\n{run.describe()}"
    assert "has not completed after" in caller.output, run.describe()
    assert "ending this process" in caller.output, run.describe()
    assert sleeper.returncode is None, f"rank 1 was not still asleep\n{run.describe()}"


@needs_gpu
@pytest.mark.parametrize("nproc", (2, 3))
def test_fast_path_split_mismatch_ends_in_the_watchdogs_report(launch_ranks, nproc):
    """Rank 0 passes head_splits, the others do not (no FAST_ULYSSES_DEBUG): no byte of a
    mismatched call reaches a peer's window, another tag's window is intact, and every rank's
    watchdog reports the call naming a peer whose release was for a different call
    (tests/workers/fast_mismatch.py; each rank exits 3 after the report)."""
    env = {"FAST_ULYSSES_WATCHDOG_S": "5", "FAST_ULYSSES_WATCHDOG_ACTION": "report"}
    run = launch_ranks("fast_mismatch", nproc, timeout=120, shared_gpu=True, env=env)
    for r in run.ranks:
        assert f"rank {r.rank}: windows intact" in r.output, run.describe()
        assert "of tag 'bad' has not completed after" in r.output, run.describe()
        assert "for a different call (signature 0x" in r.output, run.describe()
        # 3: the rank ended itself after its report; None: the launcher ended it once another
        # rank had (every report is out by then: 5 s against the ranks' 10 s).
        assert r.returncode in (3, None), f"rank {r.rank}: {r.status()}\n{run.describe()}"


# -- the worker's own pieces, on CPU --------------------------------------------------------

WATCHDOG_REPORT = (
    "fast-ulysses watchdog: group '3': rank 0: call #1 of tag 'late' has not completed after 2 s."
    " Flags on this rank, per peer: held (1 = peer has not released its window yet; otherwise"
    " the signature of the call it released it for) [- 1 2147483649]"
    " held-owned [- 0 0] landed (1 = peer's chunk arrived, not yet consumed) [- 0 1]. A peer"
    " that lags is stuck, has died, or issued a different call sequence (set"
    " FAST_ULYSSES_DEBUG=1 to check every call's agreement across ranks)."
)


def test_watchdog_check_accepts_the_report_it_expects():
    a2a_correctness.check_watchdog_report(f"other output\n{WATCHDOG_REPORT}\n", "3", 3)


@pytest.mark.parametrize(
    "text,why",
    [
        ("", "0 watchdog reports"),
        (f"{WATCHDOG_REPORT}\n{WATCHDOG_REPORT}", "2 watchdog reports"),
        (WATCHDOG_REPORT.replace("group '3'", "group '4'"), "does not name the group"),
        (WATCHDOG_REPORT.replace("tag 'late'", "tag 'early'"), "does not name the group"),
        (WATCHDOG_REPORT.replace("after 2 s", "after 1 s"), "before the 2 s timeout"),
        (WATCHDOG_REPORT.replace("[- 1 2147483649]", "[- 1]"), "held flags"),
        (WATCHDOG_REPORT.replace(" landed (1", " gone (1"), "lacks the landed flags"),
    ],
)
def test_watchdog_check_rejects_a_wrong_report(text, why):
    with pytest.raises(AssertionError, match=re.escape(why)):
        a2a_correctness.check_watchdog_report(text, "3", 3)


def test_captured_stderr_sees_writes_to_file_descriptor_2(capfd):
    import os

    with a2a_correctness.captured_stderr() as captured:
        os.write(2, b"from C++\n")
    assert captured["text"] == "from C++\n"
    assert capfd.readouterr().err == "from C++\n"  # echoed afterwards


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
def test_packed_views_are_the_strided_views_models_pass(layout):
    """The "packed_views" check's inputs (packed_views.packed): views of x's shape and values
    over a larger buffer; the qkv packings have exactly the strides of a packed projection's q, k
    or v (qkv.view(b, s, 3, N, d)[:, :, i]; bhsd: a (b, 3N, s, d) narrowed along the heads), and
    only a transpose of more than one head and row is named as copied (moves_as_it_stands)."""
    import packed_views

    x = torch.randn(2, 3, 4, 8).to(torch.bfloat16)
    b, n = x.shape[0 if layout != "sbhd" else 1], x.shape[2 if layout != "bhsd" else 1]
    if layout == "bhsd":
        qkv = torch.empty(b, 3 * n, x.shape[2], x.shape[3]).narrow(1, n, n)
    else:
        qkv = torch.empty(*x.shape[:2], 3, n, x.shape[3])[:, :, 1]
    for packing in packed_views.PACKINGS:
        view = packed_views.packed(x, layout, packing, which=1)
        assert view.shape == x.shape and torch.equal(view, x), packing
        if packing == "transposed":  # the same bytes, in another order
            assert not view.is_contiguous()
        else:
            assert view.untyped_storage().nbytes() > x.numel() * x.element_size(), packing
        if packing.startswith("qkv"):
            assert view.stride() == qkv.stride(), (packing, view.stride(), qkv.stride())
        want = packing != "transposed"
        assert packed_views.moves_as_it_stands(x, layout, packing) is want, packing
    assert packed_views.moves_as_it_stands(x[:, :1], layout, "transposed")
