"""FP8 on the wire: what a round trip loses, measured on CPU (FP8 rounding is the same
arithmetic on any device).

    python -m fast_ulysses.bench.wire_accuracy --out-dir DIR     # prints a table, writes JSON

Two parts:

- **Per element.** q/k/v-like bf16 tensors through `fast_ulysses.wire`'s round trip (quantize,
  unpack, dequantize to bf16: what a wire call returns) in each format: the largest error of a
  row over its amax (against its ceiling, the format's half step at its top binade plus the
  final rounding to bf16, and the documented bound), the mean absolute error and the
  signal-to-error ratio. Data: standard normal ("random"), and per model shape (Wan 2.1 14B: 40
  heads, 1.3B: 12, HunyuanVideo: 24; d = 128; --tokens tokens): normal values times a per-head
  scale (2^u, u uniform in [-2, 2]) and a per-token scale (log-normal, sigma 0.5), q and k also
  with OUTLIERS channels per head OUTLIER_GAIN times larger (no real weights are available
  offline: a synthetic stand-in, stated as such in the JSON).
- **A diffusers Wan attention block.** A `WanTransformer3DModel` built like the tests' (random
  seeded weights, d = 128), its first block's self-attention (`blocks[0].attn1`: projections,
  RMSNorm, RoPE, attention, output projection) in bf16 on --nproc gloo ranks, each rank holding
  its sequence rows, the attention itself `UlyssesAttention` (the fallback group) with and
  without `wire_dtype` (q, k, v and the output moved in FP8). The gathered output against the
  plain bf16 run on the same ranks and against one fp32 process: max abs, mean abs and PSNR
  (20 log10(max |reference| / RMS error)).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import math
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from .. import wire
from ..cli._args import integer
from ..presets import PRESETS, even_splits

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
BOUND = {"e4m3": 2.0**-4, "e5m2": 2.0**-3}  # docs/API.md's per-row bound, over amax
MODELS = (  # (name, preset whose heads and head_dim the tensors take)
    ("wan-14b", "wan-720p"),
    ("wan-1.3b", "wan-1.3b-720p"),
    ("hunyuan", "hunyuan-720p"),
)
OUTLIERS, OUTLIER_GAIN = 4, 16.0  # channels per head of q and k, and how much larger
DISTRIBUTION = (
    "synthetic: normal values x a per-head scale 2^u (u uniform in [-2, 2]) x a per-token "
    f"log-normal scale (sigma 0.5); q and k with {OUTLIERS} channels per head x{OUTLIER_GAIN:g} "
    "(outlier channels); v without"
)


def half_step(name: str) -> float:
    """Half the format's step in its top binade, over its max: the largest rounding error of an
    element, relative to the row's amax, where the scale is a normal float32."""
    info = torch.finfo(FORMATS[name])
    top = 2.0 ** math.floor(math.log2(info.max))
    return top * info.eps / 2 / info.max


def ceiling(name: str, dtype: torch.dtype) -> float:
    """The largest error over amax a row should show: the format's half step plus the final
    rounding to x's dtype (half its step at amax's binade: eps / 2 of amax at most)."""
    return half_step(name) + torch.finfo(dtype).eps / 2


# -- per element --------------------------------------------------------------------------


def round_trip(x: torch.Tensor, wire_dtype: torch.dtype) -> torch.Tensor:
    """What a wire call returns for x: quantized, packed, unpacked, dequantized to x's dtype."""
    return wire.dequantize(*wire.unpack(wire.quantize(x, wire_dtype)), dtype=x.dtype)


def element_errors(x: torch.Tensor, name: str) -> dict:
    """The round trip's errors on x (rows: the last dimension) in format `name`."""
    xf = x.float()
    err = (round_trip(x, FORMATS[name]).float() - xf).abs()
    amax = xf.abs().amax(-1)
    rel = err.amax(-1)[amax > 0] / amax[amax > 0]
    mse = err.square().mean().item()
    return {
        "format": name,
        "max_rel_row": rel.max().item() if rel.numel() else 0.0,
        "mean_rel_row": rel.mean().item() if rel.numel() else 0.0,
        "half_step": half_step(name),
        "ceiling": ceiling(name, x.dtype),
        "bound": BOUND[name],
        "within_bound": bool(rel.numel() == 0 or rel.max().item() <= BOUND[name]),
        "max_abs": err.max().item(),
        "mean_abs": err.mean().item(),
        "mean_abs_x": xf.abs().mean().item(),
        "snr_db": _db(xf.square().mean().item(), mse),
    }


def _db(signal: float, noise: float) -> float:
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def qkv_like(heads: int, tokens: int, d: int, seed: int) -> dict:
    """q, k and v (1, tokens, heads, d) in bf16 of DISTRIBUTION."""
    g = torch.Generator().manual_seed(seed)
    head_scale = 2.0 ** (torch.rand(1, 1, heads, 1, generator=g) * 4 - 2)
    token_scale = torch.exp(0.5 * torch.randn(1, tokens, 1, 1, generator=g))
    out = {}
    for name in ("q", "k", "v"):
        x = torch.randn(1, tokens, heads, d, generator=g) * head_scale * token_scale
        if name != "v":
            channels = torch.stack(
                [torch.randperm(d, generator=g)[:OUTLIERS] for _ in range(heads)]
            )
            gain = torch.ones(heads, d).scatter_(1, channels, OUTLIER_GAIN)
            x = x * gain.view(1, 1, heads, d)
        out[name] = x.to(torch.bfloat16)
    return out


def element_table(tokens: int, seed: int) -> list[dict]:
    """One record per (data, tensor, format)."""
    g = torch.Generator().manual_seed(seed)
    data = [("random", "x", torch.randn(1, tokens, 40, 128, generator=g).bfloat16())]
    for i, (model, preset) in enumerate(MODELS):
        p = PRESETS[preset]
        for name, x in qkv_like(p.heads, tokens, p.head_dim, seed + 1 + i).items():
            data.append((model, name, x))
    records = []
    for source, tensor, x in data:
        for name in FORMATS:
            records.append({"data": source, "tensor": tensor, "shape": list(x.shape)})
            records[-1].update(element_errors(x, name))
    return records


# -- a diffusers Wan attention block on gloo ranks -----------------------------------------


def _diffusers(module: str):
    """A diffusers module (an optional dependency, like the integrations' frameworks)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"the Wan block row needs diffusers, which is not installed (pip install diffusers): "
            f"{error}"
        ) from error


def tiny_wan(heads: int, head_dim: int = 128):
    """A small WanTransformer3DModel (2 layers, random seeded weights), as the tests build it,
    at the real head_dim."""
    torch.manual_seed(0)
    return _diffusers("diffusers").WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=2,
        rope_max_seq_len=1024,
    )


def block_inputs(model, frames: int, size: int, seed: int) -> tuple:
    """(hidden states (1, S, dim) normal, RoPE (cos, sin)) for latents (1, 4, frames, size,
    size): S = frames * (size / 2)^2 tokens."""
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(1, 4, frames, size, size, generator=g)
    dim = model.config.num_attention_heads * model.config.attention_head_dim
    tokens = frames * (size // 2) ** 2
    return torch.randn(1, tokens, dim, generator=g), model.rope(latents)


def _attention_via(module, splits):
    """diffusers' dispatch_attention_fn for the block's processor: this rank's q, k, v rows
    (bshd) through `module` (UlyssesAttention), the same arguments the block passes."""

    def dispatch(query, key, value, attn_mask=None, **_):
        assert attn_mask is None, "the self-attention of a Wan block takes no mask"
        return module(query, key, value, seq_splits=splits)

    return dispatch


def block_rank(rank: int, world: int, store: str, cfg: dict, result: str) -> None:
    """One gloo rank: the block's attention on its rows with each wire dtype; rank 0 writes the
    errors to `result`."""
    import torch.distributed as dist

    import fast_ulysses as fu

    transformer_wan = _diffusers("diffusers.models.transformers.transformer_wan")

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model = tiny_wan(cfg["heads"])
    hidden, (cos, sin) = block_inputs(model, cfg["frames"], cfg["size"], cfg["seed"])
    attn32 = model.blocks[0].attn1
    attn16 = copy.deepcopy(attn32).to(torch.bfloat16)
    splits = even_splits(hidden.shape[1], world)
    lo = sum(splits[:rank])
    hi = lo + splits[rank]
    group = fu.TorchUlyssesGroup(dist.group.WORLD)
    original = transformer_wan.dispatch_attention_fn
    outputs = {}
    try:
        for name in ("bf16", *FORMATS):
            module = fu.UlyssesAttention(group, wire_dtype=FORMATS.get(name))
            transformer_wan.dispatch_attention_fn = _attention_via(module, splits)
            with torch.no_grad():
                mine = attn16(
                    hidden[:, lo:hi].bfloat16(),
                    rotary_emb=(cos[:, lo:hi], sin[:, lo:hi]),
                )
            gathered = [None] * world
            dist.all_gather_object(gathered, mine)
            outputs[name] = torch.cat(gathered, dim=1).float()
    finally:
        transformer_wan.dispatch_attention_fn = original
    if rank == 0:
        with torch.no_grad():
            reference = attn32(hidden, rotary_emb=(cos, sin)).float()  # one fp32 process
        Path(result).write_text(json.dumps(block_errors(outputs, reference, cfg, world)))
    group.destroy()
    dist.destroy_process_group()


def output_errors(got: torch.Tensor, want: torch.Tensor) -> dict:
    err = (got - want).abs()
    rms = err.square().mean().sqrt().item()
    return {
        "max_abs": err.max().item(),
        "mean_abs": err.mean().item(),
        "psnr_db": _db(want.abs().max().item() ** 2, rms**2),
        "max_abs_reference": want.abs().max().item(),
    }


def block_errors(outputs: dict, reference: torch.Tensor, cfg: dict, world: int) -> dict:
    records = []
    for name, out in outputs.items():
        record = {"output": name, "vs_fp32": output_errors(out, reference)}
        if name != "bf16":
            record["vs_bf16"] = output_errors(out, outputs["bf16"])
        records.append(record)
    return {
        "model": "diffusers WanTransformer3DModel, blocks[0].attn1, random seeded weights",
        "heads": cfg["heads"],
        "head_dim": 128,
        "tokens": reference.shape[1],
        "world_size": world,
        "group": "TorchUlyssesGroup on gloo (CPU)",
        "input": "hidden states standard normal; RoPE of the model for latents "
        f"(1, 4, {cfg['frames']}, {cfg['size']}, {cfg['size']})",
        "records": records,
    }


def run_block(cfg: dict, world: int) -> dict:
    """The block's errors, computed on `world` spawned gloo ranks."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "block.json")
        store = os.path.join(tmp, "store")
        mp.spawn(block_rank, args=(world, store, cfg, result), nprocs=world)
        return json.loads(Path(result).read_text())


# -- the command ---------------------------------------------------------------------------


def machine() -> dict:
    return {
        "device": "cpu",
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d"),
    }


def _commit() -> str:
    try:
        here = Path(__file__).resolve().parent
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure(args) -> dict:
    results = {
        "machine": machine(),
        "args": vars(args),
        "distribution": DISTRIBUTION,
        "elements": element_table(args.tokens, args.seed),
    }
    if args.nproc:
        cfg = dict(heads=args.block_heads, frames=args.frames, size=args.size, seed=args.seed)
        results["block"] = run_block(cfg, args.nproc)
    return results


def element_lines(records: list[dict]) -> list[str]:
    head = (
        f"{'data':<9} {'tensor':<6} {'format':<6} {'max err/amax':>12} {'ceiling':>8} "
        f"{'bound':>7} {'mean abs':>9} {'mean |x|':>9} {'SNR dB':>7}"
    )
    lines = [head]
    for r in records:
        lines.append(
            f"{r['data']:<9} {r['tensor']:<6} {r['format']:<6} {r['max_rel_row']:>12.4f} "
            f"{r['ceiling']:>8.4f} {r['bound']:>7.4f} {r['mean_abs']:>9.4g} "
            f"{r['mean_abs_x']:>9.4g} {r['snr_db']:>7.2f}"
        )
    return lines


def block_lines(block: dict) -> list[str]:
    lines = [
        f"{block['model']}: {block['heads']} heads x {block['head_dim']}, {block['tokens']} "
        f"tokens, {block['world_size']} ranks ({block['group']})",
        f"{'output':<6} {'against':<7} {'max abs':>9} {'mean abs':>9} {'PSNR dB':>8}",
    ]
    for r in block["records"]:
        for against in ("vs_bf16", "vs_fp32"):
            if against in r:
                e = r[against]
                lines.append(
                    f"{r['output']:<6} {against[3:]:<7} {e['max_abs']:>9.4g} "
                    f"{e['mean_abs']:>9.4g} {e['psnr_db']:>8.2f}"
                )
    return lines


def write(results: dict, out_dir: str) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y%m%d-%H%M%S')}-cpu-wire-accuracy.json"
    path.write_text(json.dumps(results, indent=2))
    return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fast_ulysses.bench.wire_accuracy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out-dir", default="fast-ulysses-results", help="where the JSON goes")
    p.add_argument(
        "--tokens", type=integer(2048, minimum=1), default=2048, help="sequence slice per tensor"
    )
    p.add_argument(
        "--block-heads", type=integer(12, minimum=1), default=12, help="the Wan block's heads"
    )
    p.add_argument(
        "--frames", type=integer(4, minimum=1), default=4, help="latent frames of the block"
    )
    p.add_argument(
        "--size",
        type=integer(32, minimum=2),
        default=32,
        help="latent height and width (even): frames x (size / 2)^2 tokens",
    )
    p.add_argument(
        "--nproc", type=integer(2, minimum=0), default=2, help="gloo ranks (0: no block part)"
    )
    p.add_argument("--seed", type=integer(0, minimum=0), default=0)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    results = measure(args)
    print("\n".join(element_lines(results["elements"])))
    if "block" in results:
        print()
        print("\n".join(block_lines(results["block"])))
    print(f"results: {write(results, args.out_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
