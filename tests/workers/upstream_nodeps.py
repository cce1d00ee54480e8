"""xDiT (xfuser 0.7.0) and FastVideo (fastvideo 0.2.1) as installed without their dependency
trees (requirements/upstream-nodeps.txt, into build/upstream-nodeps; FAST_ULYSSES_UPSTREAM_NODEPS
names another folder): only the modules that define their Ulysses all-to-alls are imported.

The folder is not put on sys.path (both wheels ship top-level `tests`, `examples`, `docs`
packages). Instead each package, and the subpackages whose `__init__` pulls in the rest of the
framework, is entered in sys.modules as an empty package shell whose `__path__` points at its
folder, so importing a submodule runs that submodule's own code (and its real imports) but not
the skipped `__init__`:
- xfuser, xfuser.model_executor.layers: xfuser's `__init__` imports every pipeline (distvae,
  transformers, which are not installed); layers' imports every layer wrapper. With them skipped,
  xfuser.model_executor.layers.usp imports with nothing stubbed (diffusers and yunchang from
  requirements/dev.txt).
- fastvideo, fastvideo.distributed, fastvideo.platforms: fastvideo's `__init__` imports its video
  generator (imageio, torchvision, transformers, ...), platforms' imports fastvideo.utils
  (imageio). With them skipped, fastvideo.distributed.communication_op and
  fastvideo.distributed.device_communicators.base_device_communicator import with nothing
  stubbed.
Nothing else of either framework is replaced.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = Path(os.environ.get("FAST_ULYSSES_UPSTREAM_NODEPS", ROOT / "build" / "upstream-nodeps"))
SHELLS = {
    "xfuser": ("xfuser", "xfuser.model_executor.layers"),
    "fastvideo": ("fastvideo", "fastvideo.distributed", "fastvideo.platforms"),
}
INSTALL = (
    "python -m pip install --no-deps --upgrade --target build/upstream-nodeps "
    "-r requirements/upstream-nodeps.txt"
)


def missing(package: str) -> str:
    """Why `package` cannot be tested ("" when its files are there): the skip reason."""
    if not (FOLDER / package / "__init__.py").is_file():
        return f"{package} is not installed in {FOLDER} ({INSTALL})"
    return ""


def load(package: str, module: str):
    """Imports `module` of `package` from FOLDER through the package shells (see the module's
    docstring); an ImportError here is a real failure, not a skip."""
    for name in SHELLS[package]:
        if name not in sys.modules:
            shell = types.ModuleType(name)
            shell.__path__ = [str(FOLDER.joinpath(*name.split(".")))]
            sys.modules[name] = shell
    return importlib.import_module(module)
