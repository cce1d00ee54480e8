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


def _tier(world: int) -> tuple:
    """The fast tier launches P = 2; 3 and 4 (uneven heads) are the full tier's."""
    return () if world == 2 else (pytest.mark.full,)


@pytest.mark.parametrize(
    "world,check",
    [pytest.param(w, c, marks=_tier(w)) for w in WORLDS for c in diffusers_patch.check_names(w)],
)
def test_diffusers_context_parallel(runs, world, check):
    runs(world).assert_check(check)


@pytest.mark.parametrize("world", [pytest.param(w, marks=_tier(w)) for w in WORLDS])
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
    "start,nproc,args,heads,tokens",
    [
        ("python", 2, [], 4, 12),
        pytest.param(
            "torchrun",
            3,
            ["--heads", "5", "--latent", "1", "14", "2", "--anything"],
            5,
            7,
            marks=pytest.mark.full,
        ),
    ],
)
def test_example_runs(start, nproc, args, heads, tokens):
    """examples/diffusers_wan.py on CPU ranks, started as every example is (python, --nproc) and
    under torchrun: patched, every Ulysses all-to-all (2 layers x 4 forward + 4 backward) on our
    group, within float32 rounding of one process."""
    launcher = (
        [sys.executable, str(EXAMPLE), "--nproc", str(nproc)]
        if start == "python"
        else [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        + [str(EXAMPLE)]
    )
    result = subprocess.run(
        [*launcher, *args],
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


def test_patch_applies_the_cpu_shims_and_unpatch_undoes_them(dispatch):
    """Without an accelerator (this machine, or CUDA_VISIBLE_DEVICES=""), patch_diffusers also
    makes diffusers' context parallelism runnable on CPU ranks: enable_parallelism's
    `rank % torch.accelerator.device_count()` no longer divides by 0, its sharder's logger has
    warning_once, and ulysses_anything's output gather pads CPU tensors for gloo. unpatch puts
    every one back."""
    from diffusers.hooks import context_parallel

    count = torch.accelerator.device_count
    gather = context_parallel._all_gather_anything
    logger_had = "warning_once" in vars(context_parallel.logger)
    fd.patch_diffusers()
    assert torch.accelerator.device_count() == max(count(), 1)
    assert callable(context_parallel.logger.warning_once)
    assert context_parallel._all_gather_anything is not gather
    fd.unpatch_diffusers()
    assert torch.accelerator.device_count is count
    assert context_parallel._all_gather_anything is gather
    assert ("warning_once" in vars(context_parallel.logger)) == logger_had


API = Path(__file__).resolve().parents[2] / "docs" / "API.md"

# What a user has before docs/API.md's diffusers snippet: a diffusers transformer (a tiny Wan,
# seeded) and its inputs, and the output of one process to compare with.
SNIPPET_BEFORE = """
import copy, sys
import torch
from diffusers import WanTransformer3DModel

torch.manual_seed(0)
transformer = WanTransformer3DModel(
    patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=4,
    out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=64,
)
g = torch.Generator().manual_seed(1)
x, text = torch.randn(1, 4, 3, 4, 4, generator=g), torch.randn(1, 5, 32, generator=g)
t = torch.tensor([500.0])
want = copy.deepcopy(transformer)(x, t, text, return_dict=False)[0]
"""
SNIPPET_AFTER = """
from fast_ulysses.attention import group_for

group = group_for(transformer._parallel_config.context_parallel_config._ulysses_mesh.get_group())
calls, inner = [], group.all_to_all_single_4d
group.all_to_all_single_4d = lambda *a, **k: calls.append(1) or inner(*a, **k)
out = transformer(x, t, text, return_dict=False)[0]
ok = (out - want).abs().max().item() <= 1e-4 * want.abs().max().item()
print(f"rank {dist.get_rank()}: {len(calls)} all-to-alls on fast-ulysses, within 1e-4: {ok}")
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if ok and calls else 1)
"""


def api_snippet() -> str:
    """The code block of docs/API.md's "diffusers (context parallelism)" section."""
    text = API.read_text()
    section = text[text.index("### diffusers (context parallelism)") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


def test_the_api_snippet_runs_as_written_on_cpu_ranks(tmp_path):
    """docs/API.md's patch_diffusers snippet, copied as it is between a user's model and its
    forward, on 2 CPU ranks under torchrun: before, diffusers raised ZeroDivisionError there
    (the CPU shims were only in the example). The output is within float32 rounding of one
    process, and fast-ulysses carried the Ulysses all-to-alls (4 per layer in the forward)."""
    if not API.is_file():
        pytest.skip("needs the checkout's docs/API.md (scripts/check_wheel.sh's copy has none)")
    script = tmp_path / "snippet.py"
    script.write_text(SNIPPET_BEFORE + api_snippet() + SNIPPET_AFTER)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"),
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for rank in range(2):
        assert f"rank {rank}: 8 all-to-alls on fast-ulysses, within 1e-4: True" in out, out
