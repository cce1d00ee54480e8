"""What the installed distribution carries and promises: one version, the torch it was built
for (and a clear refusal under another), its dependencies, its LICENSE, the plot extra, the
benchmarks without their records.
Everything here reads the installed package, so it checks a wheel as well as a checkout."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fast_ulysses
from fast_ulysses import _build_info, _ops, _version, topology_probe
from fast_ulysses.bench import report
from fast_ulysses.cli import doctor

DIST = "fast-ulysses"
# Imported top-level module -> the distribution that provides it.
PROVIDERS = {
    "torch": "torch",
    "rich": "rich",
    "pynvml": "nvidia-ml-py",
    "matplotlib": "matplotlib",
    "cuda": "cuda-bindings",
}


def test_version_comes_from_one_place():
    assert fast_ulysses.__version__ == _version.__version__
    assert importlib.metadata.version(DIST) == _version.__version__


def test_build_info_records_this_torch():
    assert _ops._release(_build_info.TORCH_VERSION) == _ops._release(torch.__version__)
    assert _build_info.TORCH_CUDA_VERSION == (torch.version.cuda or "")
    assert set(_build_info.CUDA_ARCHS.split(",")) <= {"80", "90", "100", "120"}


def test_torch_mismatch_allows_only_the_same_release():
    assert _ops.torch_mismatch("2.11.0+cu130", "13.0", "2.11.0+cu128", "12.8") == ""
    message = _ops.torch_mismatch("2.11.0+cu130", "13.0", "2.11.1", None)
    assert "torch 2.11.0+cu130 (CUDA 13.0)" in message and "torch 2.11.1 (CPU-only)" in message
    assert "torch==2.11.0" in message and "--no-build-isolation" in message


def test_cuda_mismatch_compares_major_versions():
    assert _ops.cuda_mismatch("13.0", "2.11.0", "13.2") == ""
    assert _ops.cuda_mismatch("", "2.11.0", None) == ""  # built without CUDA: nothing to load
    message = _ops.cuda_mismatch("13.0", "2.11.0+cu128", "12.8")
    assert "built for CUDA 13.0" in message and "CUDA 12.8" in message
    assert "no CUDA (a CPU-only build)" in _ops.cuda_mismatch("13.0", "2.11.0+cpu", None)


def test_import_under_another_torch_says_so():
    """A real `import fast_ulysses` with torch reporting another release: a clear ImportError
    naming both versions and the rebuild, and the native library is never loaded."""
    code = (
        "import sys, torch; torch.__version__ = '2.99.0+cu999'\n"
        "try:\n    import fast_ulysses\n"
        "except ImportError as error:\n"
        "    assert 'fast_ulysses._C' not in sys.modules\n    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"built against torch {_build_info.TORCH_VERSION}" in done.stdout
    assert "torch 2.99.0+cu999" in done.stdout and "pip install --no-build-isolation" in done.stdout
    assert "undefined symbol" not in done.stdout


def _imported_modules() -> set[str]:
    """Top-level names of every absolute import in the installed package's Python files."""
    names = set()
    for path in Path(fast_ulysses.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "fast_ulysses"}


def _requirements() -> dict[str, set[str]]:
    """{"": required distributions, extra: that extra's} from the installed metadata."""
    out: dict[str, set[str]] = {}
    for line in importlib.metadata.requires(DIST) or []:
        requirement, _, marker = line.partition(";")
        name = requirement.strip().split("[")[0]
        for sep in "<>=!~ ":
            name = name.split(sep)[0]
        extra = marker.split("extra ==")[1].strip().strip("'\"") if "extra ==" in marker else ""
        out.setdefault(extra, set()).add(name.lower())
    return out


def test_dependencies_are_what_the_package_imports():
    imported = _imported_modules()
    assert imported <= PROVIDERS.keys(), (
        f"imports with no known provider: {imported - PROVIDERS.keys()}"
    )
    requirements = _requirements()
    assert requirements[""] == {"torch", "rich", "nvidia-ml-py"}
    assert requirements["plot"] == {"matplotlib"}
    assert requirements["micro"] == {"cuda-bindings"}  # fast_ulysses.bench.micro_copy
    assert {PROVIDERS[m] for m in imported} == (
        requirements[""] | requirements["plot"] | requirements["micro"]
    )


def test_the_benchmarks_ship_without_their_records():
    """Every benchmark is a module of the installed package (`python -m fast_ulysses.bench.<name>`
    works from a wheel); the recorded results (benchmarks/results/) are data of the source tree
    and ship nowhere in it."""
    package = Path(fast_ulysses.__file__).parent
    for name in ("__main__", "command", "quick_wan", "micro_copy", "fallback_check_cost"):
        assert (package / "bench" / f"{name}.py").is_file(), f"no fast_ulysses/bench/{name}.py"
    records = [p for p in package.rglob("*") if p.suffix in (".json", ".png")]
    assert not records, f"recorded results inside the package: {records[:3]}"


def test_license_ships_with_the_distribution():
    dist = importlib.metadata.distribution(DIST)
    licenses = [f for f in dist.files or [] if f.name == "LICENSE"]
    assert licenses, "no LICENSE among the installed distribution's files"
    text = licenses[0].read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "Apache-2.0" in (dist.metadata.get("License-Expression") or dist.metadata.get("License"))


def test_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert report.write_plot({"cases": []}, tmp_path / "plot.png") is None
    assert "pip install 'fast-ulysses[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "plot.png").exists()


def test_doctor_versions_say_none_for_what_it_cannot_see():
    versions = doctor._versions(topology_probe.Nvml())  # never entered: NVML reports nothing
    assert versions["fast_ulysses"] == fast_ulysses.__version__
    assert versions["built_for_torch"] == _build_info.TORCH_VERSION
    assert versions["torch"] == torch.__version__
    assert versions["driver"].startswith("none (") and versions["driver_cuda"].startswith("none (")
    assert all(isinstance(v, str) and v for v in versions.values()), versions


@pytest.mark.parametrize("module", ["fast_ulysses._C", "fast_ulysses._cuda"])
def test_the_extension_carries_no_libstdcxx_of_its_own(module):
    """A compiler wrapper (or nvcc's implicit link directories) can link a static libstdc++ into
    the extension, which then crashes on its first C++ exception. Its locale facets are the
    sign: no money_put may be defined in the module (docs/INSTALL.md, "Known build pitfall")."""
    import importlib.util
    import shutil

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        pytest.skip(f"{module} is not built here")
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", spec.origin], capture_output=True, text=True, check=True
    ).stdout
    carried = [line for line in symbols.splitlines() if "money_put" in line]
    assert not carried, f"{spec.origin} defines libstdc++'s own symbols: {carried[:3]}"
