"""diffusers' context parallelism on fast-ulysses: a tiny WanTransformer3DModel, patched.

    torchrun --nproc-per-node 2 examples/diffusers_wan.py [--heads 3 --latent 1 14 2 --anything]

Each rank builds the same tiny Wan transformer (2 layers, heads of 16, random weights, seeded,
float32), keeps a copy for one process, and turns on diffusers' Ulysses context parallelism
with one added line, `patch_diffusers()`:

    from fast_ulysses.integrations.diffusers import patch_diffusers
    patch_diffusers()
    transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world_size))

Then every attention's all-to-alls run on fast-ulysses (the fast group on GPUs where make_group
picks it, the torch.distributed fallback on CPU ranks over gloo). It runs a forward and a
backward on both, and prints how many all-to-alls fast-ulysses carried, and the largest
difference of the output, and of each parameter's gradient summed over ranks, from the
one-process model (float32 rounding: the ranks' linear layers see only their rows, and
gradients add the same terms in another order); it exits 1 if either exceeds 1e-4 of the
largest value. --heads that the rank count does not divide work;
--anything (diffusers' `ulysses_anything=True`) also takes a token count it does not divide
(latent frames x height/2 x width/2 tokens).

With GPUs: one rank per GPU, NCCL (gloo for diffusers' small CPU gathers). Without: CPU ranks
over gloo, with three shims for diffusers 0.42.1 that are not on the all-to-all path (see
`cpu_shims`).
"""

from __future__ import annotations

import argparse
import copy
import logging
import os

import torch
import torch.distributed as dist

from fast_ulysses.attention import group_for
from fast_ulysses.integrations.diffusers import patch_diffusers


def cpu_shims() -> None:
    """diffusers 0.42.1 on CPU ranks over gloo: enable_parallelism computes rank %
    torch.accelerator.device_count() (0 without a GPU); its sharder calls
    logger.warning_once, which only exists once transformers is imported; and
    ulysses_anything gathers the output with dist.all_gather of unequal tensors, which gloo
    refuses (padded here)."""
    from diffusers.hooks import context_parallel
    from diffusers.models._modeling_parallel import gather_size_by_comm

    if torch.accelerator.device_count() == 0:
        torch.accelerator.device_count = lambda: 1
    if not hasattr(logging.Logger, "warning_once"):
        logging.Logger.warning_once = logging.Logger.warning

    def all_gather_anything(tensor, dim, group):
        tensor = tensor.contiguous()
        sizes = gather_size_by_comm(tensor.shape[dim], group)
        pad = list(tensor.shape)
        pad[dim] = max(sizes) - tensor.shape[dim]
        padded = torch.cat([tensor, tensor.new_zeros(pad)], dim)
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes)], dim)

    context_parallel._all_gather_anything = all_gather_anything


def forward_backward(model, x, t, text, w):
    out = model(x, t, text, return_dict=False)[0]
    (out * w).sum().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def count_calls(group) -> list[int]:
    """Counts this rank's calls of the group's all-to-all (to show the patch is in use)."""
    calls, inner = [0], group.all_to_all_single_4d

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    group.all_to_all_single_4d = counted
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--latent", type=int, nargs=3, default=(3, 4, 4), metavar=("FRAMES", "HEIGHT", "WIDTH")
    )
    parser.add_argument(
        "--anything", action="store_true", help="diffusers' ulysses_anything=True (any token count)"
    )
    args = parser.parse_args()
    use_gpu = torch.cuda.is_available()
    if use_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("cpu:gloo,cuda:nccl" if use_gpu else "cpu:gloo")
    if not use_gpu:
        cpu_shims()
    from diffusers import ContextParallelConfig, WanTransformer3DModel

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if use_gpu else torch.device("cpu")
    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=args.heads,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=2,
        rope_max_seq_len=64,
    ).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, *args.latent, generator=g).to(device)
    text = torch.randn(1, 5, 32, generator=g).to(device)
    w = torch.randn(x.shape, generator=g).to(device)
    t = torch.tensor([500.0], device=device)
    want_out, want_grads = forward_backward(copy.deepcopy(model), x, t, text, w)

    patch_diffusers()  # the one line: before or after enable_parallelism
    model.enable_parallelism(
        config=ContextParallelConfig(ulysses_degree=world, ulysses_anything=args.anything)
    )
    group = group_for(model._parallel_config.context_parallel_config._ulysses_mesh.get_group())
    calls = count_calls(group)
    out, grads = forward_backward(model, x, t, text, w)
    out_diff = (out - want_out).abs().max().item()
    grad_diff = 0.0
    for name, want in want_grads.items():
        dist.all_reduce(grads[name])
        grad_diff = max(
            grad_diff, (grads[name] - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
        )
    ok = out_diff <= 1e-4 * want_out.abs().max().item() and grad_diff <= 1e-4
    if rank == 0:
        kind = (
            "fast path (UlyssesGroup)"
            if not group.fallback
            else f"torch.distributed fallback (TorchUlyssesGroup): {group.fallback_reason}"
        )
        tokens = args.latent[0] * (args.latent[1] // 2) * (args.latent[2] // 2)
        print(f"{world} ranks on {'GPUs' if use_gpu else 'CPU (gloo)'}, {kind}")
        print(f"tiny Wan: {args.heads} heads, {tokens} tokens, ulysses_anything={args.anything}")
        print(f"Ulysses all-to-alls on fast-ulysses (forward and backward): {calls[0]}")
        print(f"output: largest difference from one process {out_diff:.3e}")
        print(f"gradients (summed over ranks): largest relative difference {grad_diff:.3e}")
        print(f"within float32 rounding (1e-4): {ok}")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
