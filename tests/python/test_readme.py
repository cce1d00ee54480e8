"""README.md says what was measured where: its opening claims agree with its Status section, a
speed-up reads as one, and what it says a GPU-less build needs is what the build asks for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end > 0 else None]


def opening() -> str:
    """The tagline: everything before the first blank line after the title."""
    body = README.split("\n", 1)[1].lstrip("\n")
    return body.split("\n\n", 1)[0]


def test_the_tagline_claims_nothing_the_status_calls_unmeasured():
    """While Status says nothing on several GPUs was measured, the tagline states a design goal
    ("designed to"), says where it was measured, and says the rest was not."""
    status, tagline = " ".join(section("Status").split()), " ".join(opening().split())
    if "Not measured yet: anything on several GPUs" in status:
        assert "designed to" in tagline, tagline
        assert "single GPUs only" in tagline, tagline
        assert "nothing on several GPUs has been measured" in tagline, tagline


def test_every_speedup_reads_as_faster():
    """ "4.9x the baseline" read as 4.9x slower: every "N.Nx" in the README's prose says faster
    or slower (or is a count of something, like "1.15x the plain call" in the docs)."""
    for match in re.finditer(r"(\d+(?:\.\d+)?)x\b([^.;:]*)", " ".join(README.split())):
        after = match.group(2)
        assert after.lstrip().startswith(("faster", "slower")), match.group(0)


def test_the_taglines_figure_is_the_status_figure():
    tagline, status = " ".join(opening().split()), " ".join(section("Status").split())
    for figure in re.findall(r"\d+(?:\.\d+)?x faster", tagline):
        assert figure in status, (figure, status)


def test_a_gpu_less_build_needs_what_the_build_asks_for():
    """The README says a GPU-less build needs nvcc because cmake/torch.cmake requires the CUDA
    toolkit; the default architectures it names are cmake/cuda_arch.cmake's."""
    if not (ROOT / "cmake").is_dir():
        pytest.skip(
            "needs the checkout's cmake/ (scripts/check_wheel.sh's copy of the tests has none)"
        )
    text = " ".join(README.split())
    assert "find_package(CUDAToolkit" in (ROOT / "cmake" / "torch.cmake").read_text()
    assert "CUDA toolkit (nvcc and headers)" in text and "on a machine without a GPU too" in text
    archs = re.search(
        r"set\(FAST_ULYSSES_SUPPORTED_ARCHS ([\d ]+)\)",
        (ROOT / "cmake" / "cuda_arch.cmake").read_text(),
    ).group(1)
    named = ", ".join(f"sm{a}" for a in archs.split())
    assert f"({named})" in text, named
    assert "FAST_ULYSSES_CUDA_ARCH=90 pip install -e . --no-build-isolation" in text
