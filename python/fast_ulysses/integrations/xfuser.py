"""xDiT (xfuser): the all-to-alls of its USP attention (`xfuser.model_executor.layers.usp`),
in its (b, h, s, d) layout (its combined q/k/v, GQA included, as one call of the group, as xDiT
makes one collective), and `patch_xfuser()` / `unpatch_xfuser()` to make xDiT use them and
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


def _check(tensors, names):
    """Each tensor a 4-d (b, h, s, d) tensor, at every P; `names` names each in a refusal."""
    for i, t in enumerate(tensors):
        name = names[i] if i < len(names) else f"extra[{i - len(names)}]"
        check_tensor(name, t, 4, "xDiT's USP all-to-alls take 4-d (b, h, s, d) tensors")


def _ulysses_world(group):
    """(the group, its size P) for `group` (None: xDiT's Ulysses group), without building its
    fast-ulysses group (a collective), so the arguments are checked first."""
    pg = _ulysses_group(group)
    return pg, world_of(pg)[0]


def _exchange(tensors, mode, group, names=("input",)):
    """Each 4-d (b, h, s, d) tensor through one all-to-all in `mode` (0: scatter heads, gather
    the sequence; 1: the reverse) on the group; unchanged at P = 1, as xDiT returns them.
    `group` takes what the other adapters take (a ProcessGroup, a fast-ulysses group), None
    meaning xDiT's Ulysses group. The tensors (at every P) and the group are checked before
    anything is sent; `names` names each tensor in a refusal.

    Raises:
        FastUlyssesError for a tensor that is not 4-d or a group of another kind.
    """
    _check(tensors, names)
    pg, P = _ulysses_world(group)
    if P <= 1:
        return tuple(tensors)
    fu_group = group_for(pg)
    return tuple(
        fu_group.all_to_all_single_4d(t.contiguous(), mode, None, layout="bhsd") for t in tensors
    )


def _shapes(tensors) -> str:
    return ", ".join(str(tuple(t.shape)) for t in tensors)


def input_all_to_all(x: torch.Tensor, group=None) -> torch.Tensor:
    """xDiT's `_ft_c_input_all_to_all`: (b, h, s/P, d) -> (b, h/P, s, d). Differentiable.
    `group`: a ProcessGroup or a fast-ulysses group; None: xDiT's Ulysses group."""
    return _exchange((x,), 0, group)[0]


def output_all_to_all(x: torch.Tensor, group=None) -> torch.Tensor:
    """xDiT's `_ft_c_output_all_to_all`: (b, h/P, s, d) -> (b, h, s/P, d). Differentiable."""
    return _exchange((x,), 1, group)[0]


def combined_qkv_all_to_all(q, k, v, *extra, group=None) -> tuple:
    """xDiT's `_combined_qkv_all_to_all`: q, k, v (and tensors shaped like q) each
    (b, h, s/P, d) -> (b, h/P, s, d), returned in order, in ONE all-to-all of the group, as
    xDiT makes one: the n tensors stacked along the batch, (n * b, h, s/P, d), is one regular
    call whose result, split back along the batch, is each tensor's own all-to-all (rank r
    receives heads r of every one). Differentiable.

    Raises:
        FastUlyssesError, at every P and before anything is sent, for a tensor that is not 4-d
        or a k, v or extra tensor not shaped like q (xDiT stacks them: its rule, which it checks
        only at P > 1; for k and v with fewer heads use `combined_gqa_qkv_all_to_all`).
    """
    tensors = (q, k, v, *extra)
    _check(tensors, ("q", "k", "v"))
    if any(t.shape != q.shape for t in tensors):
        raise FastUlyssesError(
            f"q, k, v, *extra have shapes {_shapes(tensors)}: xDiT's _combined_qkv_all_to_all "
            "stacks them, so each must be shaped like q (k and v with fewer heads: "
            "combined_gqa_qkv_all_to_all)"
        )
    pg, P = _ulysses_world(group)
    if P <= 1:
        return tensors
    n, b = len(tensors), q.shape[0]
    # One contiguous (n * b, h, s/P, d) buffer, as xDiT's torch.stack makes; one call.
    stacked = torch.stack(tensors).view(n * b, *q.shape[1:])
    out = group_for(pg).all_to_all_single_4d(stacked, 0, None, layout="bhsd")
    return tuple(out.view(n, b, *out.shape[1:]).unbind(0))


def combined_gqa_qkv_all_to_all(q, k, v, *extra, group=None) -> tuple:
    """xDiT's `_combined_gqa_qkv_all_to_all`: the same, k and v with fewer heads than q (each
    head count divisible by P), in ONE all-to-all of the group, as xDiT makes one.

    Where every tensor has q's batch, sequence and head dim (always, from xDiT's USP), each
    tensor's heads are grouped by destination rank and the groups concatenated along the heads:
    (b, P * t, s/P, d) with t = (hq + 2 * hkv + hq * len(extra)) / P, rank r's t heads being its
    q heads, then its k heads, v heads and extra heads. One regular call (even head splits of t)
    gives every rank (b, t, s, d), split back along the heads. Where the sequence lengths differ
    (xDiT allows it), the tensors are packed as xDiT packs them (each rank's chunk of every
    tensor, flattened and concatenated: (P, n)) and carried as one (1, 1, P, n) call, which is
    exactly an equal-split all_to_all_single. Results are contiguous, as xDiT's. Differentiable.

    Raises:
        FastUlyssesError (a ValueError, as xDiT's errors), before anything is sent: at every P,
        a tensor that is not 4-d, k and v of different shapes, a batch or head dim unlike q's,
        an extra tensor not shaped like q (xDiT's rules, which it checks at P > 1 only); at
        P > 1, a head count P does not divide.
    """
    tensors = (q, k, v, *extra)
    _check(tensors, ("q", "k", "v"))
    rules = (
        (k.shape != v.shape, "k and v must have identical shapes"),
        (
            any(t.shape[0] != q.shape[0] or t.shape[3] != q.shape[3] for t in tensors),
            "every tensor must have q's batch and head dim",
        ),
        (any(t.shape != q.shape for t in extra), "extra tensors must be shaped like q"),
    )
    for broken, rule in rules:
        if broken:
            raise FastUlyssesError(
                f"q, k, v, *extra have shapes {_shapes(tensors)}: {rule} (xDiT's "
                "_combined_gqa_qkv_all_to_all rule)"
            )
    pg, P = _ulysses_world(group)
    if P <= 1:
        return tensors
    if any(t.shape[1] % P for t in tensors):
        raise FastUlyssesError(
            f"q, k, v, *extra have shapes {_shapes(tensors)}: every head count must be "
            f"divisible by the Ulysses world size {P} (xDiT's _combined_gqa_qkv_all_to_all rule)"
        )
    local = [t.shape[1] // P for t in tensors]
    b, _, s, d = q.shape
    fu_group = group_for(pg)
    if all(t.shape[2] == s for t in tensors):
        # Destination-major along the heads: one contiguous buffer, one call.
        packed = torch.cat([t.unflatten(1, (P, h)) for t, h in zip(tensors, local)], dim=2)
        out = fu_group.all_to_all_single_4d(
            packed.view(b, P * sum(local), s, d), 0, None, layout="bhsd"
        )
        return tuple(t.contiguous() for t in out.split(local, dim=1))
    # xDiT's own packing: each tensor (h, b, s, d) as (P, rows), concatenated per destination.
    chunks = [t.permute(1, 0, 2, 3).contiguous().reshape(P, -1) for t in tensors]
    packed = torch.cat(chunks, dim=1)
    out = fu_group.all_to_all_single_4d(packed.view(1, 1, P, -1), 0, None).view(P, -1)
    return tuple(
        chunk.view(P, h, b, t.shape[2], d).permute(2, 1, 0, 3, 4).reshape(b, h, -1, d)
        for chunk, h, t in zip(out.split([c.shape[1] for c in chunks], dim=1), local, tensors)
    )


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
