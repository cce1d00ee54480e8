"""The upstream API's public clients (SGLang diffusion, vLLM-Omni, LightX2V), their call
patterns written from their public files, on gloo CPU ranks: the names reach the fallback
(TorchUlyssesGroup, the same surface as UlyssesGroup) and every result is bit-equal to
fast_ulysses.simulate (tests/workers/upstream_clients.py says what each check runs). One launch
of 3 ranks covers P = 1, 2, 3 (subgroups). The same worker runs on the fast group in
tests/gpu/test_upstream_clients_gpu.py."""

from __future__ import annotations

import pytest
import torch
import upstream_clients

import fast_ulysses as fu
from fast_ulysses.plan import limits

WORLD = 3


@pytest.fixture(scope="module")
def clients(launch_ranks):
    return launch_ranks("upstream_clients", WORLD, timeout=300, env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize("check", upstream_clients.check_names(WORLD, fast=False))
def test_client_pattern(clients, check):
    P = int(check.rsplit("_P", 1)[1])
    clients.assert_check(check, ranks=range(WORLD - P, WORLD))


def test_all_ranks_exit_cleanly(clients):
    clients.assert_clean_exit()


def test_module_level_names():
    """The upstream's module-level names: the group sizes and dtypes one group takes, asked of
    the plan's own rules."""
    assert fu.SUPPORTED_WORLD_SIZES == tuple(range(1, limits()["max_world_size"] + 1))
    assert [fu.supports_world_size(n) for n in (0, 1, 3, 8, 9, True, 2.0)] == [
        False,
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    assert [fu.supports_dtype(t) for t in (torch.bfloat16, torch.float8_e4m3fn, torch.int8)] == [
        True,
        True,
        True,
    ]
    assert not any(fu.supports_dtype(t) for t in (torch.float64, torch.bool, torch.complex64))
    assert not any(fu.supports_dtype(t) for t in (2, 3, 8, "bf16", None))  # a torch.dtype only


def test_nvlink_matrix_without_nvml_answers_none_or_a_full_matrix():
    """nvlink_matrix: None where NVML cannot answer (this machine has no GPU), else every
    ordered pair with (i, i) True."""
    got = fu.nvlink_matrix([0, 1])
    assert got is None or (set(got) == {(0, 0), (0, 1), (1, 0), (1, 1)} and got[(0, 0)])


def test_constructor_options_are_checked_by_name(world1):
    """backend, require_nvlink and device are checked before anything is built, on both
    groups; a torch.device or str in the second place is the upstream's device."""
    for Group in (fu.TorchUlyssesGroup,):
        with pytest.raises(fu.FastUlyssesError, match="backend='packed'"):
            Group(world1, backend="packed")
        with pytest.raises(fu.FastUlyssesError, match="require_nvlink=1"):
            Group(world1, require_nvlink=1)
        with pytest.raises(fu.FastUlyssesError, match="device='nope'"):
            Group(world1, device="nope")
        with pytest.raises(fu.FastUlyssesError, match="device=-1"):
            Group(world1, device=-1)
        assert Group(world1, torch.device("cpu")).device == torch.device("cpu")
        assert Group(world1, "cuda:1").device == torch.device("cuda", 1)  # the upstream's order
        assert Group(world1, 4096).device is None  # an int second is initial_pool_bytes
    with pytest.raises(fu.FastUlyssesError, match="process_group is 3"):
        fu.UlyssesGroup(3)
    with pytest.raises(RuntimeError, match="backend='packed'"):  # before the GPU check
        fu.UlyssesGroup(world1, backend="packed")


def test_create_returns_none_with_a_warning_where_the_fast_group_cannot_run(world1):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: create() builds the group (tests/gpu)")
    with pytest.warns(RuntimeWarning, match="unavailable: rank 0: UlyssesGroup needs a CUDA GPU"):
        assert fu.UlyssesGroup.create(world1) is None
    assert isinstance(fu.TorchUlyssesGroup.create(world1), fu.TorchUlyssesGroup)
