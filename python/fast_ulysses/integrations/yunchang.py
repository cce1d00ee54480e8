"""yunchang (and xDiT, which imports it): `all_to_all_4D`, `SeqAllToAll4D`, `SeqAllToAll5D`,
and `patch_yunchang()` / `unpatch_yunchang()` to make yunchang's and xDiT's attention layers
(`UlyssesAttention`, USP's `LongContextAttention`, xDiT's `xFuserLongContextAttention`) use
them; their rings stay yunchang's."""

from __future__ import annotations

import importlib
import sys

import torch

from ._common import check_tensor, exchange, mode_for

# The modules imported before patching, so their bound names exist to be rebound.
_KNOWN_MODULES = (
    "yunchang.comm.all_to_all",
    "yunchang.comm",
    "yunchang.ulysses.attn_layer",
    "yunchang.hybrid.attn_layer",
    "yunchang",
)
_PATCHED_PREFIXES = ("yunchang", "xfuser")
# (module name, attribute) -> (that module, the yunchang object patch_yunchang replaced there)
_REBOUND: dict = {}


def all_to_all_4D(
    input: torch.Tensor,
    scatter_idx: int = 2,
    gather_idx: int = 1,
    group=None,
    use_sync: bool = False,
) -> torch.Tensor:
    """(bs, seqlen/P, hc, hs) -> (bs, seqlen, hc/P, hs) for scatter_idx=2, gather_idx=1; the
    inverse for scatter_idx=1, gather_idx=2. `group`: a ProcessGroup (None: the default group).
    `use_sync` is accepted and changes nothing (results are ready in stream order).
    Differentiable; other index pairs raise ValueError."""
    return exchange(input, scatter_idx, gather_idx, group)


class SeqAllToAll4D:
    """`SeqAllToAll4D.apply(group, input, scatter_idx, gather_idx, use_sync=False)`:
    `all_to_all_4D` with yunchang's argument order; its backward is the reverse exchange."""

    @staticmethod
    def apply(
        group, input: torch.Tensor, scatter_idx: int, gather_idx: int, use_sync: bool = False
    ) -> torch.Tensor:
        return all_to_all_4D(input, scatter_idx, gather_idx, group, use_sync)


class SeqAllToAll5D:
    """`SeqAllToAll5D.apply(group, input, scatter_idx=3, gather_idx=1, use_sync=False)` on
    packed qkv: (bs, seqlen/P, 3, hc, hs) -> (bs, seqlen, 3, hc/P, hs) for (3, 1), the inverse
    for (1, 3). Differentiable; other index pairs raise ValueError."""

    @staticmethod
    def apply(
        group,
        input: torch.Tensor,
        scatter_idx: int = 3,
        gather_idx: int = 1,
        use_sync: bool = False,
    ) -> torch.Tensor:
        mode = mode_for(scatter_idx, gather_idx, "bsthd", ndim=5)
        check_tensor("input", input, 5, "SeqAllToAll5D takes a 5-d (bs, seqlen, 3, hc, hs) tensor")
        bs, s, three, h, d = input.shape
        # The packed dimension joins the batch: (3 * bs, s, h, d), one all-to-all for q, k, v.
        folded = input.permute(2, 0, 1, 3, 4).reshape(three * bs, s, h, d)
        out = exchange(folded, *((2, 1) if mode == 0 else (1, 2)), group)
        return out.view(three, bs, *out.shape[1:]).permute(1, 2, 0, 3, 4).contiguous()


def patch_yunchang() -> list[str]:
    """Rebinds `all_to_all_4D`, `SeqAllToAll4D` and `SeqAllToAll5D` wherever yunchang's or
    xDiT's (xfuser) loaded modules bound yunchang's own, so their attention layers use
    fast-ulysses. Call it after importing them (xDiT: after `import xfuser`).

    Returns:
        The rebound names, as "module.name".

    Raises:
        ImportError if yunchang is not installed.
    """
    try:
        importlib.import_module("yunchang")
    except ImportError as error:
        raise ImportError(
            f"patch_yunchang needs yunchang, which is not installed (pip install yunchang): {error}"
        ) from error
    for name in _KNOWN_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    ours = {
        "all_to_all_4D": all_to_all_4D,
        "SeqAllToAll4D": SeqAllToAll4D,
        "SeqAllToAll5D": SeqAllToAll5D,
    }
    modules = [
        m
        for n, m in sorted(sys.modules.items())
        if m is not None and n.split(".")[0] in _PATCHED_PREFIXES
    ]
    originals = {
        id(getattr(m, name)): name
        for m in modules
        for name in ours
        if getattr(getattr(m, name, None), "__module__", "").startswith("yunchang")
    }
    patched = []
    for module in modules:
        for name in ours:
            if id(getattr(module, name, None)) in originals:
                _REBOUND.setdefault((module.__name__, name), (module, getattr(module, name)))
                setattr(module, name, ours[name])
                patched.append(f"{module.__name__}.{name}")
    return patched


def unpatch_yunchang() -> list[str]:
    """Restores yunchang's own objects wherever `patch_yunchang()` rebound them (in the modules
    it patched, where they are still loaded under their names).

    Returns:
        The restored names, as "module.name" (none when nothing was patched).
    """
    restored = []
    for (name, attr), (module, value) in sorted(_REBOUND.items(), key=lambda kv: kv[0]):
        if sys.modules.get(name) is module:  # (not a module loaded since under that name)
            setattr(module, attr, value)
            restored.append(f"{name}.{attr}")
    _REBOUND.clear()
    return restored
