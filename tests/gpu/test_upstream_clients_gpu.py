"""The upstream API's public clients on the fast group: tests/workers/upstream_clients.py with
--shared-gpu, P = 1, 2, 3, 4 and 8 ranks sharing this machine's first GPU (one launch per P,
the fast group on the whole world), one test per check: every call pattern's results bit-equal
to fast_ulysses.simulate, empty_output buffers written by the peers, lent windows, packed-QKV
views moved as they stand, several groups on one process group and the re-probe without
destroy(). They skip, saying why, where no GPU is visible."""

from __future__ import annotations

import pytest
import upstream_clients
from _gpu import needs_gpu

NPROCS = (1, 2, 3, 4, 8)
TIMEOUT_S = 420


def clients(launch_ranks, nproc):
    return launch_ranks("upstream_clients", nproc, timeout=TIMEOUT_S, shared_gpu=True)


@needs_gpu
@pytest.mark.parametrize(
    "nproc,check", [(n, c) for n in NPROCS for c in upstream_clients.check_names(n, fast=True)]
)
def test_client_pattern_on_the_fast_group(launch_ranks, nproc, check):
    clients(launch_ranks, nproc).assert_check(check)


@needs_gpu
@pytest.mark.parametrize("nproc", NPROCS)
def test_every_rank_exits_cleanly(launch_ranks, nproc):
    clients(launch_ranks, nproc).assert_clean_exit()
