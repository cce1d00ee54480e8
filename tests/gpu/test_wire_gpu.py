"""FP8 on the wire on the fast group: tests/workers/wire.py with --shared-gpu, P = 2 and 3 ranks
sharing this machine's first GPU (UlyssesGroup over gloo), one launch per P, one test per check;
and P = 2 with FAST_ULYSSES_DEBUG=1, whose per-call check makes a wire-dtype mismatch a
FastUlyssesError on every rank (without it the watchdog reports one: fast_mismatch.py). They
skip, saying why, where no GPU is visible."""

from __future__ import annotations

import pytest
import wire as worker
from _gpu import needs_gpu

TIMEOUT_S = 480
DEBUG = {"FAST_ULYSSES_DEBUG": "1"}


def cases():
    plain = [(n, None, c) for n in (2, 3) for c in worker.check_names(n, shared_gpu=True)]
    debug = [(2, "debug", c) for c in worker.check_names(2, shared_gpu=True, debug=True)]
    return plain + debug


@needs_gpu
@pytest.mark.parametrize("nproc,env,check", cases())
def test_wire_on_the_fast_group(launch_ranks, nproc, env, check):
    env = DEBUG if env == "debug" else None
    launch_ranks("wire", nproc, timeout=TIMEOUT_S, shared_gpu=True, env=env).assert_check(check)
