"""The CPU tests' import path: tests/multirank.py, the launcher every multi-rank test uses (the
shared `world1` fixture lives in tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
