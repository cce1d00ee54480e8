"""The frameworks' own Ulysses x Ring (USP) attention with fast-ulysses' patches, against the
installed packages: one 4-rank gloo launch of tests/workers/usp_frameworks.py (ring 2 x
Ulysses 2): diffusers' ring x ulysses context parallelism on a real WanTransformer3DModel
(forward and backward), yunchang's LongContextAttention and xDiT's USP() (forward), each bit for
bit against the framework's own run, our group carrying every Ulysses all-to-all and the ring
staying the framework's. A framework that is not installed is skipped, saying so; and in
process, unpatch_yunchang()."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import usp_frameworks as worker

TIMEOUT_S = 480


MISSING = {f: worker.missing(f) for f in worker.FRAMEWORKS}
PRESENT = [f for f, reason in MISSING.items() if not reason]


@pytest.fixture(scope="module")
def ranks(launch_ranks):
    if not PRESENT:
        pytest.skip("; ".join(MISSING.values()))
    args = ("--frameworks", ",".join(PRESENT))
    return launch_ranks("usp_frameworks", worker.WORLD, *args, timeout=TIMEOUT_S)


@pytest.mark.full  # real upstream packages at 4 ranks: the full tier's
@pytest.mark.parametrize("framework", worker.FRAMEWORKS)
def test_usp_under_the_patch(ranks, framework):
    if MISSING[framework]:
        pytest.skip(MISSING[framework])
    ranks.assert_check(worker.check_names([framework])[0])


@pytest.mark.full  # real upstream packages at 4 ranks: the full tier's
def test_all_ranks_exit_cleanly(ranks):
    ranks.assert_clean_exit()


@pytest.mark.skipif(importlib.util.find_spec("yunchang") is None, reason="needs yunchang")
def test_unpatch_yunchang_restores_yunchang_own():
    import yunchang.comm.all_to_all as comm
    import yunchang.hybrid.attn_layer as hybrid

    from fast_ulysses.integrations import yunchang as ours

    ours.unpatch_yunchang()  # (what an earlier test in this process may have left patched)
    own = comm.SeqAllToAll4D
    patched = ours.patch_yunchang()
    try:
        assert "yunchang.hybrid.attn_layer.SeqAllToAll4D" in patched, patched
        assert hybrid.SeqAllToAll4D is ours.SeqAllToAll4D
    finally:
        restored = ours.unpatch_yunchang()
    assert sorted(restored) == sorted(patched)
    assert hybrid.SeqAllToAll4D is own and comm.SeqAllToAll4D is own
    assert ours.unpatch_yunchang() == []
    assert sys.modules["yunchang.comm"].all_to_all_4D.__module__.startswith("yunchang")
