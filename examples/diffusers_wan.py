"""diffusers' context parallelism on fast-ulysses: a tiny WanTransformer3DModel, patched.

    python examples/diffusers_wan.py [--nproc 2 --heads 3 --latent 1 14 2 --anything]

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

With GPUs: one rank per GPU, NCCL (gloo for diffusers' small CPU gathers). Without: 2 CPU
ranks (--nproc for more) over gloo ("cpu:gloo"; patch_diffusers also applies what diffusers
0.42.1 needs there, off the all-to-all path). Under torchrun it runs on the ranks torchrun
launched.
"""

from __future__ import annotations

import copy

import _launch  # how every example starts its ranks (examples/_launch.py)
import torch
import torch.distributed as dist
from _launch import count

from fast_ulysses.attention import group_for
from fast_ulysses.integrations.diffusers import patch_diffusers

CPU_RANKS = 2  # without a GPU
PATCH = (1, 2, 2)  # the tiny Wan's patch: frames, height, width
ROPE_MAX_SEQ_LEN = 64  # positions of its rotary embedding, on each axis


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


def run(rank: int, world: int, device: torch.device, args) -> bool:
    use_gpu = device.type == "cuda"
    from diffusers import ContextParallelConfig, WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=PATCH,
        num_attention_heads=args.heads,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=2,
        rope_max_seq_len=ROPE_MAX_SEQ_LEN,
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
        print(f"{world} ranks on {'GPUs' if use_gpu else 'CPU (gloo)'}, {kind}")
        print(
            f"tiny Wan: {args.heads} heads, {tokens(args.latent)} tokens, "
            f"ulysses_anything={args.anything}"
        )
        print(f"Ulysses all-to-alls on fast-ulysses (forward and backward): {calls[0]}")
        print(f"output: largest difference from one process {out_diff:.3e}")
        print(f"gradients (summed over ranks): largest relative difference {grad_diff:.3e}")
        print(f"within float32 rounding (1e-4): {ok}")
    return ok


def tokens(latent) -> int:
    """The sequence length of a latent (frames, height, width) after the 1x2x2 patches."""
    frames, height, width = latent
    return frames // PATCH[0] * (height // PATCH[1]) * (width // PATCH[2])


def check(args, world: int) -> str:
    """What in `args` this run cannot take on `world` ranks ("" when nothing)."""
    if world < 2:
        return (
            f"--nproc is {world}: diffusers' context parallelism needs at least 2 ranks "
            "(ulysses_degree > 1; e.g. --nproc 2)"
        )
    if args.heads < world:  # a rank without heads: torch's CPU attention dies of SIGFPE
        return (
            f"--heads is {args.heads}: it must be at least the {world} ranks, one head or more "
            f"on every rank (e.g. --heads {world})"
        )
    frames, height, width = args.latent
    for name, value, patch in (("HEIGHT", height, PATCH[1]), ("WIDTH", width, PATCH[2])):
        if value % patch:
            return (
                f"--latent {frames} {height} {width}: {name} {value} is not a multiple of the "
                f"patch size {patch} (e.g. --latent {frames} {height + height % patch} "
                f"{width + width % patch})"
            )
    for name, value, patch in zip(("FRAMES", "HEIGHT", "WIDTH"), args.latent, PATCH):
        if value // patch > ROPE_MAX_SEQ_LEN:
            return (
                f"--latent {frames} {height} {width}: {name} {value} is more than "
                f"{ROPE_MAX_SEQ_LEN * patch}, the {ROPE_MAX_SEQ_LEN} positions of the model's "
                "rotary embedding"
            )
    n = tokens(args.latent)
    if args.anything and n < world:
        return (
            f"--latent {frames} {height} {width} is {n} tokens: it must be at least the {world} "
            "ranks, one token or more on every rank"
        )
    if not args.anything and n % world:
        return (
            f"--latent {frames} {height} {width} is {n} tokens: diffusers shards them evenly, "
            f"so the {world} ranks must divide them (add --anything for any token count)"
        )
    return ""


def main() -> int:
    parser = _launch.parser(__doc__, cpu_ranks=CPU_RANKS)
    parser.add_argument("--heads", type=count(4), default=4, help="attention heads, of 16 each")
    parser.add_argument(
        "--latent",
        type=count("3 4 4"),
        nargs=3,
        default=(3, 4, 4),
        metavar=("FRAMES", "HEIGHT", "WIDTH"),
        help="the latent's frames, height and width (height and width even)",
    )
    parser.add_argument(
        "--anything", action="store_true", help="diffusers' ulysses_anything=True (any token count)"
    )
    args = parser.parse_args()  # every argument checked before any rank starts
    world = _launch.world_size(parser, args, CPU_RANKS)
    problem = check(args, world)
    if problem:
        parser.error(problem)
    use_gpu = torch.cuda.is_available()
    backend = "cpu:gloo,cuda:nccl" if use_gpu else "cpu:gloo"
    return _launch.launch(run, args, world, backend=backend)


if __name__ == "__main__":
    raise SystemExit(main())
