"""The adapters against the real upstream packages on the fast group: with --shared-gpu,
tests/workers/upstream_frameworks.py (yunchang, diffusers and DeepSpeed's own all-to-alls and
layers), deepspeed_adapter.py (DeepSpeed's DistributedAttention at every index pair, rotary, its
uneven-heads path and the refusals) and xdit_fastvideo.py (xfuser's USP all-to-alls and
patch_xfuser, the combined q/k/v as one call of the group; FastVideo's all_to_all_4D and
patch_fastvideo through its own sequence_model_parallel_all_to_all_4D, calls counted; from
build/upstream-nodeps, as upstream_nodeps.py describes), P = 1, 2, 3 ranks sharing this
machine's first GPU, one launch per worker and P (the fast group runs a worker on its whole
world only), one test per check. Ours runs on the
fast group on cuda:0, upstream's functions on the same CUDA tensors over the gloo process group;
every comparison is the CPU tests' own, bit for bit, forward and gradients. Each launch's first
check, fast_group_P<p>, is that the fast group (not the fallback) was chosen. They skip, saying
why, where no GPU is visible or a package is not importable (scripts/device.sh installs them
from .whl/upstream)."""

from __future__ import annotations

import importlib.util

import deepspeed_adapter
import pytest
import upstream_frameworks
import upstream_nodeps
import xdit_fastvideo
from _gpu import needs_gpu
from multirank import FAST_GROUP_CHECK

NPROCS = (1, 2, 3)
TIMEOUT_S = 300
# DeepSpeed's CUDA accelerator, as on a GPU machine (its all-to-alls go through torch either way).
ENV = {"DS_ACCELERATOR": "cuda"}


def not_importable(*packages: str) -> str:
    """The skip reason naming those of `packages` that are not importable ("" if all are)."""
    gone = [p for p in packages if importlib.util.find_spec(p) is None]
    if not gone:
        return ""
    return f"{', '.join(gone)} not importable (scripts/device.sh installs it from .whl/upstream)"


# worker -> {framework: why its checks cannot run, "" where they can}
MISSING = {
    "upstream_frameworks": {f: not_importable(f) for f in upstream_frameworks.CHECKS},
    "deepspeed_adapter": {"deepspeed": not_importable("deepspeed")},
    "xdit_fastvideo": {
        # xfuser's USP module imports yunchang (where CUDA is available), diffusers and einops.
        "xfuser": upstream_nodeps.missing("xfuser")
        or not_importable("yunchang", "diffusers", "einops"),
        "fastvideo": upstream_nodeps.missing("fastvideo"),
    },
}


def launch(launch_ranks, worker: str, nproc: int):
    """`worker`'s launch at `nproc` ranks sharing the GPU, with the frameworks that can run (one
    launch per worker and P in the session); skips, saying why, when none can."""
    present = [f for f, why in MISSING[worker].items() if not why]
    if not present:
        pytest.skip("; ".join(MISSING[worker].values()))
    args = () if worker == "deepspeed_adapter" else ("--frameworks", ",".join(present))
    return launch_ranks(worker, nproc, *args, timeout=TIMEOUT_S, shared_gpu=True, env=ENV)


def cases():
    """(worker, P, framework, check) of every framework check."""
    for n in NPROCS:
        for framework, check in upstream_frameworks.check_names(n, True):
            yield "upstream_frameworks", n, framework, check
        for check in deepspeed_adapter.check_names(n, True):
            yield "deepspeed_adapter", n, "deepspeed", check
        for framework, check in xdit_fastvideo.check_names(n, True):
            yield "xdit_fastvideo", n, framework, check


@needs_gpu
@pytest.mark.parametrize("worker,nproc,framework,check", list(cases()))
def test_against_upstream_on_the_fast_group(launch_ranks, worker, nproc, framework, check):
    if MISSING[worker][framework]:
        pytest.skip(MISSING[worker][framework])
    launch(launch_ranks, worker, nproc).assert_check(check)


@needs_gpu
@pytest.mark.parametrize("worker", sorted(MISSING))
@pytest.mark.parametrize("nproc", NPROCS)
def test_the_fast_group_was_chosen(launch_ranks, worker, nproc):
    launch(launch_ranks, worker, nproc).assert_check(f"{FAST_GROUP_CHECK}_P{nproc}")


@needs_gpu
@pytest.mark.parametrize("worker", sorted(MISSING))
@pytest.mark.parametrize("nproc", NPROCS)
def test_run_ends_cleanly(launch_ranks, worker, nproc):
    launch(launch_ranks, worker, nproc).assert_clean_exit()
