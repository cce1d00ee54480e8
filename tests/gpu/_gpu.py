"""What every GPU test shares: the skip without a GPU. (The environment of ranks sharing the first
GPU is tests/workers/multirank.py's SHARED_GPU_ENV, which `launch_ranks` applies.)"""

from __future__ import annotations

import pytest
import torch

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA GPU visible: the fast path cannot run here"
)
