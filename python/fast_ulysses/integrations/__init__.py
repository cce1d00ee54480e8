"""Drop-in replacements for the Ulysses all-to-alls of other frameworks, with their upstream
signatures and meaning (backward included), running on a fast-ulysses group:

- `fast_ulysses.integrations.yunchang`: yunchang / xDiT (`all_to_all_4D`, `SeqAllToAll4D`,
  `SeqAllToAll5D`, `patch_yunchang()` / `unpatch_yunchang()`).
- `fast_ulysses.integrations.deepspeed`: DeepSpeed-Ulysses (`DistributedAttention`).
- `fast_ulysses.integrations.diffusers`: diffusers' context parallelism
  (`_all_to_all_dim_exchange`, `SeqAllToAllDim`, `patch_diffusers()` / `unpatch_diffusers()`).
- `fast_ulysses.integrations.xfuser`: xDiT's USP all-to-alls (`input_all_to_all`,
  `combined_qkv_all_to_all`, ..., `patch_xfuser()` / `unpatch_xfuser()`).
- `fast_ulysses.integrations.fastvideo`: FastVideo (`all_to_all_4D`, `patch_fastvideo()` /
  `unpatch_fastvideo()`).

The upstream `group` argument is a torch ProcessGroup; it is mapped to a fast-ulysses group by
`fast_ulysses.attention.group_for` (built on first use). Calls use owned results and
`tag=None` (`fast_ulysses.auto_tag`), so they are differentiable and need no tag.
In the frameworks' Ulysses x Ring (USP) modes the patches carry the Ulysses all-to-alls only;
each framework's ring stays its own (docs/API.md, "Framework integrations").
"""

from . import deepspeed, diffusers, fastvideo, yunchang  # noqa: F401
