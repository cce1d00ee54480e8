"""torchrun worker: the fast path's correctness on a real node, or with ranks sharing one GPU.

    # a real node, one GPU per rank, NCCL; the reference is TorchUlyssesGroup over NCCL
    torchrun --nproc-per-node 8 tests/workers/a2a_correctness.py
    # P ranks sharing cuda:0 (gloo; the reference group runs on CPU copies over gloo)
    FAST_ULYSSES_ALLOW_SHARED_GPU=1 torchrun --nproc-per-node 4 \
        tests/workers/a2a_correctness.py --shared-gpu

Rank 0 prints one line per check group and a closing 'N passed, N failed' line; any failure
raises on the rank that saw it, so torchrun exits non-zero. Launched by multirank.py (as
tests/gpu does), each rank also writes a JSON report naming every check and how it ended.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import time

import a2a_checks
import a2a_packed
import torch
import torch.distributed as dist
from multirank import Report

import fast_ulysses as fu


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="all ranks on cuda:0 over gloo (needs FAST_ULYSSES_ALLOW_SHARED_GPU=1)",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=1000,
        help="back-to-back calls with fresh inputs (default 1000)",
    )
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="compare with simulate only, not with TorchUlyssesGroup",
    )
    return parser.parse_args()


def reference_group(pg, shared_gpu: bool, device):
    """TorchUlyssesGroup on the same ranks: NCCL on the GPUs, or gloo on CPU copies."""
    if not hasattr(fu, "TorchUlyssesGroup"):
        return None, None
    if shared_gpu:
        return fu.TorchUlyssesGroup(pg), torch.device("cpu")
    return fu.TorchUlyssesGroup(pg), device


def check_reserve_and_recreate(pg, rank, world_size, device, log) -> str:
    """destroy() then a new group in the same processes; reserve() seals the pool and an
    undeclared call raises before anything is sent; use after destroy raises."""
    group = fu.UlyssesGroup(pg, 0)
    case = a2a_checks.cases(world_size)[0]
    shape = case.input_shape(rank)
    group.reserve(
        [
            fu.CallSpec(
                shape=shape,
                dtype=case.dtype,
                mode=0,
                tag="declared",
                seq_splits=list(case.seq_splits),
                head_splits=list(case.head_splits),
                layout=case.layout,
            )
        ]
    )
    stats = group.stats()
    assert stats["sealed"] is True, stats
    fallback = fu.TorchUlyssesGroup(pg)  # both groups' stats() have the same keys, in order
    assert list(stats) == list(fallback.stats()), (list(stats), list(fallback.stats()))
    fallback.destroy()
    xs = a2a_checks.inputs_for(case, world_size, seed=77)
    y = group.all_to_all_single_4d(
        xs[rank].to(device),
        0,
        "declared",
        seq_splits=list(case.seq_splits),
        head_splits=list(case.head_splits),
        layout=case.layout,
    )
    want = fu.simulate(
        xs,
        0,
        seq_splits=list(case.seq_splits),
        head_splits=list(case.head_splits),
        layout=case.layout,
    )[rank]
    assert torch.equal(y.cpu(), want), "declared call after reserve() is wrong"
    for tag, scale in (("undeclared", 1), ("declared", 4)):
        big = (
            torch.randn(case.batch * scale, *shape[1:], dtype=case.dtype, device=device)
            if case.layout == "bshd"
            else torch.randn(
                shape[0], case.batch * scale, *shape[2:], dtype=case.dtype, device=device
            )
        )
        try:
            group.all_to_all_single_4d(
                big,
                0,
                tag,
                seq_splits=list(case.seq_splits),
                head_splits=list(case.head_splits),
                layout=case.layout,
            )
        except ValueError as error:
            assert "reserve()" in str(error), error
        else:
            raise AssertionError(f"call with tag {tag!r} x{scale} after reserve() did not raise")
    group.destroy()
    try:
        group.barrier()
    except RuntimeError:
        pass
    else:
        raise AssertionError("barrier() after destroy() did not raise")
    return "reserve() seals; undeclared and oversized calls raise; destroy + new group"


def check_tag_rules(pg, rank, world_size, device) -> str:
    """On a new group: reserve() refuses a tag deferred by barrier=False until barrier(), as a
    call does; a call the sealed pool refuses uses no tag slot (stats()["tags"] unchanged)."""
    group = fu.UlyssesGroup(pg, 0)
    case = a2a_checks.cases(world_size)[0]
    splits = dict(
        seq_splits=list(case.seq_splits), head_splits=list(case.head_splits), layout=case.layout
    )
    x = a2a_checks.inputs_for(case, world_size, seed=91)[rank].to(device)
    spec = fu.CallSpec(shape=case.input_shape(rank), dtype=case.dtype, mode=0, tag="held", **splits)
    group.all_to_all_single_4d_borrowed(x, 0, "held", barrier=False, **splits)
    try:
        group.reserve([spec])
    except ValueError as error:
        assert "barrier()" in str(error), f"reserve() of a deferred tag: {error}"
    else:
        raise AssertionError("reserve() accepted a tag deferred by barrier=False")
    group.barrier()
    group.reserve([spec])
    tags = group.stats()["tags"]
    try:
        group.all_to_all_single_4d(x, 0, "undeclared", **splits)
    except ValueError as error:
        assert "reserve()" in str(error), error
    else:
        raise AssertionError("a call with an undeclared tag after reserve() did not raise")
    after = group.stats()["tags"]
    assert after == tags, f"a call the sealed pool refused used a tag slot: tags {tags} -> {after}"
    group.destroy()
    return "reserve() refuses a deferred tag; a refused call uses no tag slot"


def check_debug_mode(pg, rank, world_size, device) -> str:
    """FAST_ULYSSES_DEBUG=1: a call that differs across ranks, or that is invalid on one rank
    only, raises on every rank (naming the calls) before anything is sent."""
    os.environ["FAST_ULYSSES_DEBUG"] = "1"
    try:
        group = fu.UlyssesGroup(pg, 1 << 20)
    finally:
        del os.environ["FAST_ULYSSES_DEBUG"]
    x = torch.randn(1, 4, 2 * world_size, 64, dtype=torch.bfloat16, device=device)
    group.all_to_all_single_4d(x, 0, "agreed")
    # float64 (8-byte elements) is refused by the input rule; any row width is valid.
    attempts = [
        (
            "invalid on rank 0 only",
            lambda: group.all_to_all_single_4d(x.double() if rank == 0 else x, 0, "bad"),
            "which is invalid",
        )
    ]
    attempts.append(
        (
            "on the CPU on rank 0 only",
            lambda: group.all_to_all_single_4d(x.cpu() if rank == 0 else x, 0, "bad"),
            "x is on cpu but the group is on cuda",
        )
    )
    if world_size > 1:
        attempts.append(
            (
                "a tag that differs",
                lambda: group.all_to_all_single_4d(x, 0, f"tag-of-rank-{rank}"),
                "differs across ranks",
            )
        )
    if world_size > 1:
        # Backward calls (the C++ op, called by the autograd kernel) are checked too: rank 0
        # runs its two backwards in the other order, so its first one is on another tag.
        xa, xb = (x.float().clone().requires_grad_() for _ in range(2))
        ya = group.all_to_all_single_4d(xa, 0, "grad-a")
        yb = group.all_to_all_single_4d(xb, 0, "grad-b")

        def backwards_in_rank_order():
            for y in (ya, yb) if rank == 0 else (yb, ya):
                y.sum().backward()

        attempts.append(
            (
                "backwards in another order on rank 0",
                backwards_in_rank_order,
                "differs across ranks",
            )
        )
    for name, call, needle in attempts:
        try:
            call()
        except ValueError as error:
            assert needle in str(error), f"{name}: {error}"
        else:
            raise AssertionError(f"debug mode let '{name}' through")
    group.destroy()
    return (
        "FAST_ULYSSES_DEBUG=1: mismatched and one-rank-invalid calls raise on every rank, "
        "backward calls included"
    )


@contextlib.contextmanager
def captured_stderr():
    """Everything written to file descriptor 2 inside the block (the C++ watchdog's fputs
    included), as `captured["text"]`; echoed to the real stderr afterwards."""
    captured = {"text": ""}
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured["text"] = sink.read().decode(errors="replace")
    sys.stderr.write(captured["text"])
    sys.stderr.flush()


def check_watchdog_report(text: str, group_name: str, world_size: int) -> None:
    """Rank 0's watchdog report on the late call: exactly one, naming the group, the call and
    its tag, a wait of at least the 2 s timeout, and every flag list with one entry per rank
    ('-' for rank 0 itself, a flag value for each peer)."""
    reports = [line for line in text.splitlines() if line.startswith("fast-ulysses watchdog:")]
    assert len(reports) == 1, f"{len(reports)} watchdog reports, want 1: {text!r}"
    report = reports[0]
    head = re.match(
        rf"fast-ulysses watchdog: group '{re.escape(group_name)}': rank 0: call #1 "
        rf"of tag 'late' has not completed after (\d+) s\. Flags on this rank, per "
        rf"peer:",
        report,
    )
    assert head, f"watchdog report does not name the group, the call and its tag: {report!r}"
    assert int(head.group(1)) >= 2, f"reported after {head.group(1)} s, before the 2 s timeout"
    for flags in ("held", "held-owned", "landed"):
        found = re.search(rf" {flags}(?: \([^)]*\))? \[([^\]]*)\]", report)
        assert found, f"watchdog report lacks the {flags} flags: {report!r}"
        values = found.group(1).split()
        assert (
            len(values) == world_size and values[0] == "-" and all(v.isdigit() for v in values[1:])
        ), f"{flags} flags {values}: {report!r}"
    assert "FAST_ULYSSES_DEBUG=1" in report, report


def check_watchdog(pg, rank, world_size, device) -> str:
    """Ranks 1.. issue their call 5 s late: rank 0's handshake waits, and its watchdog (2 s
    here, action 'report') reports it on stderr, which rank 0 captures and checks
    (check_watchdog_report); then the call completes."""
    settings = {"FAST_ULYSSES_WATCHDOG_S": "2", "FAST_ULYSSES_WATCHDOG_ACTION": "report"}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        group = fu.UlyssesGroup(pg, 1 << 20)
    finally:
        for name, value in previous.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    x = torch.randn(1, 4, 2 * world_size, 64, dtype=torch.bfloat16, device=device)
    if rank != 0:
        time.sleep(5)
    with captured_stderr() if rank == 0 else contextlib.nullcontext() as captured:
        y = group.all_to_all_single_4d(x, 0, "late")
        torch.cuda.synchronize()
    if rank == 0:
        check_watchdog_report(captured["text"], group.group_name, world_size)
    assert y.shape == (1, 4 * world_size, 2, 64)
    group.destroy()
    return "a late peer: the watchdog reports the stuck handshake, then the call completes"


def check_unwaited(pg, rank, world_size, device) -> str:
    """Results never used leave nothing in c10d's registry of unwaited work once destroy()
    returns (torch would otherwise warn about unwaited collectives at exit)."""
    registry_size = torch._C._distributed_c10d._get_work_registry_size
    before = registry_size()
    group = fu.UlyssesGroup(pg, 1 << 20)
    x = torch.randn(1, 4, 2 * world_size, 64, dtype=torch.bfloat16, device=device)
    for i in range(40):
        group.all_to_all_single_4d(x, 0, "dropped")
        group.all_to_all_single_4d_borrowed(x, 0, f"dropped-b{i % 3}")
    held = registry_size() - before
    group.destroy()
    after = registry_size() - before
    assert after == 0, f"rank {rank}: {after} unwaited works left after destroy() ({held} before)"
    return f"80 results never used: {held} works held, 0 after destroy()"


# Every check, in run order (tests/gpu runs one pytest test per check and P).
CHECKS = (
    "matrix",
    "async_consumer",
    "borrowed_lifetime",
    "deferred_barrier",
    "bad_calls",
    "aliasing",
    "out",
    "packed_views",
    "back_to_back",
    "eager_graphs",
    "async_result",
    "streams",
    "reserve_and_recreate",
    "tag_rules",
    "unwaited",
    "debug_mode",
    "watchdog",
)


def check_names(world_size: int) -> list[str]:
    """The checks that run at this world size (the watchdog needs a late peer)."""
    return [name for name in CHECKS if name != "watchdog" or world_size > 1]


def main() -> int:
    args = parse_args()
    backend = "gloo" if args.shared_gpu else "nccl"
    dist.init_process_group(backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", 0 if args.shared_gpu else local_rank)
    torch.cuda.set_device(device)
    pg = dist.group.WORLD

    start = time.time()
    report = Report(rank)
    passed = []
    group = fu.UlyssesGroup(pg, initial_pool_bytes=1 << 20)
    ref, ref_device = (
        (None, None) if args.no_reference else reference_group(pg, args.shared_gpu, device)
    )
    checker = a2a_checks.Checker(group, rank, world_size, device, ref, ref_device)
    steps = {
        "matrix": checker.check_matrix,
        "async_consumer": checker.check_async_consumer,
        "borrowed_lifetime": checker.check_borrowed_lifetime,
        "deferred_barrier": checker.check_deferred_barrier,
        "bad_calls": checker.check_bad_calls,
        "async_result": checker.check_async_result,
        "streams": checker.check_streams,
        "aliasing": checker.check_aliasing,
        "out": checker.check_out,
        "packed_views": lambda: a2a_packed.check_packed_views(checker),
        "unwaited": lambda: check_unwaited(pg, rank, world_size, device),
        "back_to_back": lambda: checker.check_back_to_back(args.iterations),
        "eager_graphs": checker.check_eager_graphs,
        "reserve_and_recreate": lambda: check_reserve_and_recreate(
            pg, rank, world_size, device, print
        ),
        "tag_rules": lambda: check_tag_rules(pg, rank, world_size, device),
        "debug_mode": lambda: check_debug_mode(pg, rank, world_size, device),
        "watchdog": lambda: check_watchdog(pg, rank, world_size, device),
    }
    for name in check_names(world_size):
        if name == "reserve_and_recreate":
            group.destroy()  # the checks from here on build their own groups
        with report.check(name) as entry:
            line = steps[name]() or checker.passed[-1]
            entry["detail"] = line
        passed.append(line)
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        for line in passed:
            print(f"  ok  {line}")
        print(
            f"P={world_size} ({'ranks share one GPU' if args.shared_gpu else backend}), "
            f"{time.time() - start:.1f} s, reference: "
            f"{'simulate + TorchUlyssesGroup' if ref is not None else 'simulate'}"
        )
        print(f"{len(passed)} passed, 0 failed")
    report.finish()
    # A group never destroyed, its last result never used: the process must still exit without
    # torch's warning about unwaited collectives (tests/gpu checks the output).
    leftover = fu.UlyssesGroup(pg, 1 << 20)
    leftover.all_to_all_single_4d(torch.ones(1, 4, 2 * world_size, 64, device=device), 0, "exit")
    torch.cuda.synchronize()
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
