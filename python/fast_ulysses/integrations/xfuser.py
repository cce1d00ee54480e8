"""xDiT (xfuser): the all-to-alls of its USP attention (`xfuser.model_executor.layers.usp`),
in its (b, h, s, d) layout, and `patch_xfuser()` / `unpatch_xfuser()` to make xDiT use them and
fast-ulysses' yunchang all-to-alls (`patch_yunchang`) in its long-context attention layer."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import torch

from ..attention import group_for
from ..errors import FastUlyssesError
from . import yunchang
from ._common import check_tensor, world_of

# xDiT's USP module and its all-to-alls, by name: ours for each.
_USP_MODULES = ("xfuser.model_executor.layers.usp", "xfuser.model_executor.layers.usp_legacy")
_REBOUND: dict = {}  # (module name, attribute) -> the object patch_xfuser replaced


def _ulysses_group(group):
    """`group`, else xDiT's Ulysses process group (yunchang's PROCESS_GROUP.ULYSSES_PG, as its
    USP module sees it)."""
    if group is not None:
        return group
    usp = sys.modules.get(_USP_MODULES[0])
    pg = getattr(getattr(usp, "PROCESS_GROUP", None), "ULYSSES_PG", None)
    if pg is None:
        raise FastUlyssesError(
            "group=None: xDiT's Ulysses group is not set up (its USP module's "
            "PROCESS_GROUP.ULYSSES_PG); pass group= or initialize xDiT first"
        )
    return pg


def _exchange(tensors, mode, group, names=("input",)):
    """Each 4-d (b, h, s, d) tensor through one all-to-all in `mode` (0: scatter heads, gather
    the sequence; 1: the reverse) on the group; unchanged at P = 1, as xDiT returns them.
    `group` takes what the other adapters take (a ProcessGroup, a fast-ulysses group), None
    meaning xDiT's Ulysses group. The tensors (at every P) and the group are checked before
    anything is sent; `names` names each tensor in a refusal.

    Raises:
        FastUlyssesError for a tensor that is not 4-d or a group of another kind.
    """
    for i, t in enumerate(tensors):
        name = names[i] if i < len(names) else f"extra[{i - len(names)}]"
        check_tensor(name, t, 4, "xDiT's USP all-to-alls take 4-d (b, h, s, d) tensors")
    pg = _ulysses_group(group)
    if world_of(pg)[0] <= 1:
        return tuple(tensors)
    fu_group = group_for(pg)
    return tuple(
        fu_group.all_to_all_single_4d(t.contiguous(), mode, None, layout="bhsd") for t in tensors
    )


def input_all_to_all(x: torch.Tensor, group=None) -> torch.Tensor:
    """xDiT's `_ft_c_input_all_to_all`: (b, h, s/P, d) -> (b, h/P, s, d). Differentiable.
    `group`: a ProcessGroup or a fast-ulysses group; None: xDiT's Ulysses group."""
    return _exchange((x,), 0, group)[0]


def output_all_to_all(x: torch.Tensor, group=None) -> torch.Tensor:
    """xDiT's `_ft_c_output_all_to_all`: (b, h/P, s, d) -> (b, h, s/P, d). Differentiable."""
    return _exchange((x,), 1, group)[0]


def combined_qkv_all_to_all(q, k, v, *extra, group=None) -> tuple:
    """xDiT's `_combined_qkv_all_to_all`: q, k, v (and tensors shaped like q) each
    (b, h, s/P, d) -> (b, h/P, s, d), returned in order. Differentiable."""
    return _exchange((q, k, v, *extra), 0, group, ("q", "k", "v"))


def combined_gqa_qkv_all_to_all(q, k, v, *extra, group=None) -> tuple:
    """xDiT's `_combined_gqa_qkv_all_to_all`: the same, k and v with fewer heads than q (each
    head count divisible by P). Differentiable."""
    return _exchange((q, k, v, *extra), 0, group, ("q", "k", "v"))


_OURS = {
    "_ft_c_input_all_to_all": input_all_to_all,
    "_ft_c_output_all_to_all": output_all_to_all,
    "_combined_qkv_all_to_all": combined_qkv_all_to_all,
    "_combined_gqa_qkv_all_to_all": combined_gqa_qkv_all_to_all,
}


def patch_xfuser() -> list[str]:
    """Makes xDiT's Ulysses all-to-alls run on fast-ulysses: rebinds the USP all-to-alls
    (`_ft_c_input_all_to_all`, `_ft_c_output_all_to_all`, `_combined_qkv_all_to_all`,
    `_combined_gqa_qkv_all_to_all`) in every loaded xfuser module that bound xDiT's own, and,
    with yunchang installed, runs `patch_yunchang()` (xDiT's long-context attention layer uses
    yunchang's `SeqAllToAll4D`). Call it after importing xfuser; `unpatch_xfuser()` undoes it.

    Returns:
        The rebound names, as "module.name".

    Raises:
        ImportError if xDiT's USP module cannot be imported.
    """
    try:
        importlib.import_module(_USP_MODULES[0])
    except ImportError as error:
        raise ImportError(
            "patch_xfuser needs xfuser (xDiT), whose USP module "
            f"{_USP_MODULES[0]} does not import: {error}"
        ) from error
    originals = {}
    for name in _USP_MODULES:
        module = sys.modules.get(name)
        for attr in _OURS:
            value = getattr(module, attr, None)
            if value is not None and value is not _OURS[attr]:
                originals[id(value)] = attr
    patched = []
    for name, module in sorted(sys.modules.items()):
        if module is None or name.split(".")[0] != "xfuser":
            continue
        for attr in _OURS:
            value = getattr(module, attr, None)
            if value is not None and originals.get(id(value)) == attr:
                _REBOUND.setdefault((name, attr), value)
                setattr(module, attr, _OURS[attr])
                patched.append(f"{name}.{attr}")
    if importlib.util.find_spec("yunchang") is not None:
        for name in yunchang._KNOWN_MODULES:  # loaded first, as patch_yunchang does
            try:
                importlib.import_module(name)
            except ImportError:
                pass
        before = _bound_names()
        for entry in yunchang.patch_yunchang():
            key = tuple(entry.rsplit(".", 1))
            _REBOUND.setdefault(key, before[key])
            patched.append(entry)
    return patched


def _bound_names() -> dict:
    """(module name, attribute) -> object, for the names patch_yunchang rebinds."""
    return {
        (name, attr): getattr(module, attr)
        for name, module in list(sys.modules.items())
        if module is not None and name.split(".")[0] in ("yunchang", "xfuser")
        for attr in ("all_to_all_4D", "SeqAllToAll4D", "SeqAllToAll5D")
        if hasattr(module, attr)
    }


def unpatch_xfuser() -> list[str]:
    """Restores every name `patch_xfuser()` rebound (in modules still loaded).

    Returns:
        The restored names, as "module.name".
    """
    restored = []
    for (name, attr), value in sorted(_REBOUND.items(), key=lambda kv: kv[0]):
        module = sys.modules.get(name)
        if module is not None:
            setattr(module, attr, value)
            restored.append(f"{name}.{attr}")
    _REBOUND.clear()
    return restored
