"""fast-ulysses: the two all-to-alls of Ulysses sequence parallelism on one NVLink node.

    import fast_ulysses
    group = fast_ulysses.make_group(process_group, initial_pool_bytes=1 << 30)
    y = group.all_to_all_single_4d(x, mode=0, tag="q")   # (b, s/P, N, d) -> (b, S, N/P, d)

GPU-free: fast_ulysses.plan(...) and fast_ulysses.simulate(...).
"""

from . import integrations  # noqa: F401  (fast_ulysses.integrations.<framework>)
from ._ops import cuda_available, cuda_load_error
from ._version import __version__
from .arguments import Mode
from .attention import UlyssesAttention
from .errors import FastUlyssesError
from .factory import UlyssesGroupLike, make_group
from .fused import qk_norm_rope_all_to_all, qk_norm_rope_all_to_all_qk
from .group import UlyssesGroup
from .mesh import usp_mesh
from .plan import DTYPE_NAMES, CopyDescriptor, Plan, plan
from .ring import ring_attention
from .simulation import simulate
from .tags import auto_tag, backward_tag
from .torch_group import TorchUlyssesGroup
from .upstream import AsyncHandle, CompletedTensor
from .upstream_options import (
    SUPPORTED_WORLD_SIZES,
    norm_rope,
    nvlink_matrix,
    supports_dtype,
    supports_world_size,
)
from .validation import CallSpec

__all__ = [
    "__version__",
    "AsyncHandle",
    "CompletedTensor",
    "SUPPORTED_WORLD_SIZES",
    "CallSpec",
    "CopyDescriptor",
    "DTYPE_NAMES",
    "FastUlyssesError",
    "Mode",
    "Plan",
    "cuda_available",
    "cuda_load_error",
    "make_group",
    "plan",
    "qk_norm_rope_all_to_all",
    "qk_norm_rope_all_to_all_qk",
    "ring_attention",
    "simulate",
    "TorchUlyssesGroup",
    "UlyssesGroup",
    "UlyssesAttention",
    "UlyssesGroupLike",
    "usp_mesh",
    "auto_tag",
    "backward_tag",
    "integrations",
    "norm_rope",
    "nvlink_matrix",
    "supports_dtype",
    "supports_world_size",
]
