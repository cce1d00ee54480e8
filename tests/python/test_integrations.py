"""fast_ulysses.integrations: one 3-rank gloo launch of tests/workers/integrations.py (P = 1, 2,
3) checks every adapter's forward and backward bit for bit against a re-implementation of the
upstream semantics; one of upstream_frameworks.py checks the yunchang, diffusers and DeepSpeed
adapters against the installed packages themselves (requirements/dev.txt installs them);
argument errors and patch_yunchang in process."""

from __future__ import annotations

import importlib.util
import re
import sys
import types

import integrations as worker
import pytest
import torch
import upstream_frameworks

from fast_ulysses.errors import FastUlyssesError
from fast_ulysses.integrations import deepspeed, diffusers, fastvideo, yunchang

WORLD = 3


@pytest.fixture(scope="module")
def ranks(launch_ranks):
    return launch_ranks("integrations", WORLD, timeout=300)


@pytest.mark.parametrize("check", worker.check_names(WORLD))
def test_worker_check(ranks, check):
    P = int(check.rsplit("_P", 1)[1])
    ranks.assert_check(check, ranks=range(WORLD - P, WORLD))


def test_all_ranks_exit_cleanly(ranks):
    ranks.assert_clean_exit()


# The frameworks installed here (requirements/dev.txt installs them); a check of one that is not
# installed is skipped, saying so.
INSTALLED = [f for f in upstream_frameworks.CHECKS if importlib.util.find_spec(f) is not None]


@pytest.fixture(scope="module")
def upstream_ranks(launch_ranks):
    if not INSTALLED:
        pytest.skip("none of yunchang, diffusers, deepspeed is installed (requirements/dev.txt)")
    return launch_ranks(
        "upstream_frameworks", WORLD, "--frameworks", ",".join(INSTALLED), timeout=300
    )


@pytest.mark.full  # a real upstream package's launch: the full tier's
@pytest.mark.parametrize("framework,check", upstream_frameworks.check_names(WORLD))
def test_against_the_installed_framework(upstream_ranks, framework, check):
    """Forward and (where upstream has one) gradients bit for bit against yunchang's and
    diffusers' own all-to-alls, yunchang's UlyssesAttention before and after patch_yunchang(),
    and DeepSpeed's DistributedAttention."""
    if framework not in INSTALLED:
        pytest.skip(f"{framework} is not installed (requirements/dev.txt)")
    P = int(check.rsplit("_P", 1)[1])
    upstream_ranks.assert_check(check, ranks=range(WORLD - P, WORLD))


@pytest.mark.full  # a real upstream package's launch: the full tier's
def test_against_the_installed_frameworks_exits_cleanly(upstream_ranks):
    upstream_ranks.assert_clean_exit()


X = torch.zeros(1, 2, 2, 8)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda g: yunchang.all_to_all_4D(X, 0, 1, g), r"scatter_idx=0, gather_idx=1: unsupported"),
        (lambda g: yunchang.SeqAllToAll4D.apply(g, X, 3, 1), r"scatter_idx=3, gather_idx=1"),
        (
            lambda g: yunchang.SeqAllToAll5D.apply(g, torch.zeros(1, 2, 3, 2, 8), 2, 1),
            r"scatter_idx=2, gather_idx=1: unsupported .* supported: \(3, 1\)",
        ),
        (lambda g: yunchang.SeqAllToAll5D.apply(g, X), r"takes a 5-d"),
        (lambda g: diffusers._all_to_all_dim_exchange(X, 2, 3, g), r"scatter_idx=2, gather_idx=3"),
        (lambda g: fastvideo.all_to_all_4D(X, 1, 1, group=g), r"scatter_dim=1, gather_dim=1"),
        # Every int (scatter_idx, gather_idx) is accepted, as DeepSpeed does (test_deepspeed_adapter).
        (
            lambda g: deepspeed.DistributedAttention(None, g, 2.0, 0),
            r"scatter_idx=2.0: it must be an int",
        ),
        (
            lambda g: deepspeed.DistributedAttention(None, g, num_kv_heads=0),
            r"num_kv_heads=0: it must be None or a positive int",
        ),
        (
            lambda g: deepspeed.DistributedAttention(None, g)(X, X, X, 2),
            r"batch_dim_idx=2: it must be 0",
        ),
        (
            lambda g: deepspeed.DistributedAttention(None, g)(X, X, X, 1, X),
            r"rotary_pos_emb is a Tensor: it must be a \(cos, sin\) pair",
        ),
        # X as sbhd on one rank: q is (1, 2, 2, 8); X's view (2, 1, 2, 8) has 2 where q has 1.
        (
            lambda g: deepspeed.DistributedAttention(None, g)(X, X, X, 1, (X, X)),
            r"rotary_pos_emb's cos has shape \(1, 2, 2, 8\): DeepSpeed applies it as "
            r"cos.permute\(1, 0, 2, 3\), which must broadcast to q's first r values after the "
            r"all-to-all, \(1, 2, 2, 8\)",
        ),
        (
            lambda g: deepspeed.DistributedAttention(None, g)(
                X, X, X, 0, (torch.zeros(2, 1, 1, 3), torch.zeros(2, 1, 1, 3))
            ),
            r"an even r <= head_dim 8",
        ),
        (
            lambda g: deepspeed.DistributedAttention(None, g)(
                X, X, X, 0, (torch.zeros(2, 1, 1, 4), torch.zeros(2, 1, 1, 2))
            ),
            r"cos and sin have shapes \(2, 1, 1, 4\) and \(2, 1, 1, 2\)",
        ),
    ],
)
def test_unsupported_arguments_raise(world1, call, message):
    with pytest.raises(ValueError, match=message):
        call(world1)


def test_negative_indices_mean_the_same_dimensions(world1):
    x = torch.randn(1, 2, 2, 8)
    assert torch.equal(yunchang.all_to_all_4D(x, -2, -3, world1), yunchang.all_to_all_4D(x))


def test_patch_yunchang_rebinds_the_imported_names(monkeypatch):
    # Stand-in modules only: an installed yunchang's loaded modules leave for the test's span.
    for name in [n for n in sys.modules if n.split(".")[0] in ("yunchang", "xfuser")]:
        monkeypatch.delitem(sys.modules, name)
    upstream = types.ModuleType("yunchang.comm.all_to_all")
    for name in ("all_to_all_4D", "SeqAllToAll4D", "SeqAllToAll5D"):
        obj = type(name, (), {"__module__": upstream.__name__})
        setattr(upstream, name, obj)
    package = types.ModuleType("yunchang")
    package.SeqAllToAll4D = upstream.SeqAllToAll4D
    layer = types.ModuleType("xfuser.core.long_ctx_attention.attn_layer")
    layer.SeqAllToAll4D, layer.all_to_all_4D = upstream.SeqAllToAll4D, upstream.all_to_all_4D
    layer.other = len  # left alone
    for module in (upstream, package, layer):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    patched = yunchang.patch_yunchang()
    assert sorted(patched) == sorted(
        [
            "yunchang.SeqAllToAll4D",
            "yunchang.comm.all_to_all.SeqAllToAll4D",
            "yunchang.comm.all_to_all.SeqAllToAll5D",
            "yunchang.comm.all_to_all.all_to_all_4D",
            "xfuser.core.long_ctx_attention.attn_layer.SeqAllToAll4D",
            "xfuser.core.long_ctx_attention.attn_layer.all_to_all_4D",
        ]
    )
    assert layer.SeqAllToAll4D is yunchang.SeqAllToAll4D and layer.other is len
    assert upstream.SeqAllToAll5D is yunchang.SeqAllToAll5D


def test_patch_yunchang_without_yunchang_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "yunchang", None)
    with pytest.raises(ImportError, match="patch_yunchang needs yunchang, which is not installed"):
        yunchang.patch_yunchang()


def _identity(q, k, v, *args, **kwargs):
    return q


@pytest.mark.parametrize("missing", ["query", "key", "value"])
def test_deepspeed_refuses_a_tensor_that_is_none(world1, missing):
    tensors = {name: X for name in ("query", "key", "value")}
    tensors[missing] = None
    attn = deepspeed.DistributedAttention(_identity, world1)
    with pytest.raises(FastUlyssesError, match=re.escape(f"{missing} is None: it must be a 4-d")):
        attn(*tensors.values(), 0)


def test_deepspeed_refuses_a_local_attention_that_is_not_callable(world1):
    with pytest.raises(
        FastUlyssesError, match=re.escape("local_attention is None: it must be callable")
    ):
        deepspeed.DistributedAttention(None, world1)(X, X, X, 0)


def test_deepspeed_refuses_a_local_attention_output_that_is_not_a_tensor(world1):
    attn = deepspeed.DistributedAttention(lambda q, k, v: None, world1)
    with pytest.raises(
        FastUlyssesError, match=re.escape("the local attention's output is None: it must be a 4-d")
    ):
        attn(X, X, X, 0)


@pytest.mark.parametrize("batch_dim_idx", [[0], True, 0.0])
def test_deepspeed_refuses_a_batch_dim_idx_that_is_not_an_int(world1, batch_dim_idx):
    attn = deepspeed.DistributedAttention(_identity, world1)
    message = f"batch_dim_idx={batch_dim_idx!r}: it must be 0 (b, s, h, d) or 1 (s, b, h, d)"
    with pytest.raises(FastUlyssesError, match=re.escape(message)):
        attn(X, X, X, batch_dim_idx)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"scatter_idx": True}, "scatter_idx=True: it must be an int"),
        ({"gather_idx": False}, "gather_idx=False: it must be an int"),
        ({"num_kv_heads": True}, "num_kv_heads=True: it must be None or a positive int"),
    ],
)
def test_deepspeed_refuses_a_bool_or_float_where_an_int_is_needed(world1, kwargs, message):
    with pytest.raises(FastUlyssesError, match=re.escape(message)):
        deepspeed.DistributedAttention(_identity, world1, **kwargs)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda g: yunchang.all_to_all_4D(X, "2", "1", g), "scatter_idx='2': it must be an int"),
        (lambda g: yunchang.all_to_all_4D(X, 2.0, 1, g), "scatter_idx=2.0: it must be an int"),
        (lambda g: yunchang.all_to_all_4D(X, 2, True, g), "gather_idx=True: it must be an int"),
        (
            lambda g: fastvideo.all_to_all_4D(X, 1, 2.0, group=g),
            "gather_dim=2.0: it must be an int",
        ),
        (
            lambda g: yunchang.SeqAllToAll5D.apply(g, torch.zeros(1, 2, 3, 2, 8), True, 3),
            "scatter_idx=True: it must be an int",
        ),
    ],
)
def test_upstream_indices_must_be_ints(world1, call, message):
    with pytest.raises(FastUlyssesError, match=re.escape(message)):
        call(world1)
