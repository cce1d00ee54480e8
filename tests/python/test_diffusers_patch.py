"""fast_ulysses.integrations.diffusers.patch_diffusers() against the installed diffusers: a real
tiny WanTransformer3DModel under diffusers' own context parallelism on 2, 3 and 4 gloo CPU
ranks (one launch of tests/workers/diffusers_patch.py per P, its whole world: diffusers' mesh
spans it), output and every parameter gradient against one process and against diffusers' own, counters
showing our group carried every Ulysses all-to-all; examples/diffusers_wan.py under torchrun;
and in process: patching twice, unpatching,
and the refusals when diffusers is missing or built otherwise. Skipped without diffusers
(requirements/dev.txt)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import diffusers_patch
import pytest
import torch

from fast_ulysses.errors import FastUlyssesError
from fast_ulysses.integrations import diffusers as fd

WORLDS = (2, 3, 4)
TIMEOUT_S = 480

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("diffusers") is None,
    reason="diffusers is not installed (requirements/dev.txt)",
)


@pytest.fixture(scope="module")
def runs(launch_ranks):
    return lambda world: launch_ranks("diffusers_patch", world, timeout=TIMEOUT_S)


@pytest.mark.parametrize(
    "world,check", [(w, c) for w in WORLDS for c in diffusers_patch.check_names(w)]
)
def test_diffusers_context_parallel(runs, world, check):
    runs(world).assert_check(check)


@pytest.mark.parametrize("world", WORLDS)
def test_all_ranks_exit_cleanly(runs, world):
    runs(world).assert_clean_exit()


@pytest.fixture
def dispatch():
    module = importlib.import_module(fd._MODULE)
    fd.unpatch_diffusers()
    yield module
    fd.unpatch_diffusers()


def test_patch_twice_then_unpatch_restores_the_originals(dispatch):
    originals = {name: getattr(dispatch, name) for name in fd._OURS}
    names = fd.patch_diffusers()
    assert names == [f"{fd._MODULE}.{n}" for n in fd._OURS]
    assert fd.patch_diffusers() == names  # a second patch changes nothing
    for name, ours in fd._OURS.items():
        assert getattr(dispatch, name) is ours, name
    assert fd.unpatch_diffusers() == names
    for name, original in originals.items():
        assert getattr(dispatch, name) is original, name
    assert fd.unpatch_diffusers() == []


def test_refuses_without_diffusers(monkeypatch):
    monkeypatch.setitem(sys.modules, fd._MODULE, None)  # import raises ImportError
    with pytest.raises(FastUlyssesError, match=r"patch_diffusers needs diffusers"):
        fd.patch_diffusers()


@pytest.mark.parametrize("name", sorted(fd._OURS))
def test_refuses_a_module_without_a_name(dispatch, monkeypatch, name):
    monkeypatch.delattr(dispatch, name)
    with pytest.raises(FastUlyssesError, match=rf"has no {name}: "):
        fd.patch_diffusers()
    assert fd._originals == {}


@pytest.mark.parametrize("caller", sorted({c for c in fd._CALLERS.values() if c}))
def test_refuses_a_caller_that_does_not_look_the_name_up(dispatch, monkeypatch, caller):
    monkeypatch.setattr(dispatch, caller, lambda *args, **kwargs: None)
    with pytest.raises(FastUlyssesError, match=rf"\.{caller} does not call "):
        fd.patch_diffusers()


def test_refuses_a_forward_with_other_arguments(dispatch, monkeypatch):
    class Other:
        @staticmethod
        def forward(ctx, query, key, value, attn_mask):
            return query

    monkeypatch.setattr(dispatch, "TemplatedUlyssesAttention", Other)
    with pytest.raises(FastUlyssesError, match=r"TemplatedUlyssesAttention\.forward takes"):
        fd.patch_diffusers()


def test_dim_exchange_refuses_other_pairs():
    with pytest.raises(FastUlyssesError, match=r"scatter_idx=2, gather_idx=3"):
        fd.SeqAllToAllDim.apply(None, torch.zeros(1, 2, 2, 2), 2, 3)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "diffusers_wan.py"


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="with GPUs the example takes one rank per GPU"
)
@pytest.mark.parametrize(
    "nproc,args,heads,tokens",
    [(2, [], 4, 12), (3, ["--heads", "5", "--latent", "1", "14", "2", "--anything"], 5, 7)],
)
def test_example_runs_under_torchrun(nproc, args, heads, tokens):
    """examples/diffusers_wan.py under torchrun on CPU ranks: patched, every Ulysses all-to-all
    (2 layers x 4 forward + 4 backward) on our group, within float32 rounding of one process."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            str(EXAMPLE),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"),
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert f"{nproc} ranks on CPU (gloo), torch.distributed fallback" in result.stdout, out
    assert f"tiny Wan: {heads} heads, {tokens} tokens" in result.stdout, out
    assert "Ulysses all-to-alls on fast-ulysses (forward and backward): 16" in result.stdout, out
    assert "within float32 rounding (1e-4): True" in result.stdout, out
