"""What every GPU test shares: the skip without a GPU, and the environment of ranks sharing
the first GPU over gloo (multicast stays off in every GPU run)."""

from __future__ import annotations

import pytest
import torch

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA GPU visible: the fast path cannot run here")
SHARED_GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                  "NVSHMEM_DISABLE_NVLS": "1", "FAST_ULYSSES_ALLOW_SHARED_GPU": "1",
                  "FAST_ULYSSES_WATCHDOG_S": "60"}
