"""Turns the benchmark's results dict into a table, a JSON file and a PNG plot. Plain data in,
files out: testable without a GPU."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

NA = "n/a"
ERROR_CHARS = 160  # of a capture error in the table (the JSON keeps all of it)


def _ms(value) -> str:
    return NA if value is None else f"{value:.3f}"


def _gbps(nbytes, ms) -> str:
    return NA if ms in (None, 0) else f"{nbytes / ms / 1e6:.1f}"


def _ratio(base, ms) -> str:
    return NA if base is None or not ms else f"{base / ms:.2f}x"


def _pct(fraction) -> str:
    return NA if fraction is None else f"{100 * fraction:.0f}%"


def overlap_text(o: dict | None) -> str:
    """hidden's median over the repeats, its spread [min, max], and the median times."""
    if o is None:
        return NA
    text = f"{_pct(o['hidden'])} hidden"
    if o.get("runs"):
        text += f" [{_pct(o['hidden_min'])}, {_pct(o['hidden_max'])} over {len(o['runs'])}]"
    chain = f"{o['gemms']} x {o['gemm_size']} GEMMs " if "gemms" in o else ""
    return (
        text + f" (chain: {chain}{o['gemm_ms']:.3f} ms, coll {o['collective_ms']:.3f}, "
        f"both {o['both_ms']:.3f})"
    )


def graph_rows(r: dict) -> list[tuple]:
    """(name, ms, host us, error) per captured entry point, when --graph was given."""
    out = []
    for key, name in (("graph_copy", "graph copy"), ("graph_borrowed", "graph borrowed")):
        g = r.get(key)
        if g is not None:
            out.append((name, g["ms"], g["host_us"], g["error"]))
    return out


def transfer_cells(r: dict, world_size: int) -> list[str]:
    """The derived transfer row's ms, GB/s, speedup and host cells. GB/s is over the bytes sent
    to peers (`peer_bytes`; files written before it existed: all of `bytes_in`). At P = 1 there
    is no transfer: the difference of two measured times would be noise, so it says n/a."""
    if world_size == 1:
        return [f"{NA}: no peers at P = 1", NA, NA, NA]
    ms = max(r["fast_copy_ms"] - r["own_share_ms"], 0.0)
    return [
        _ms(ms),
        _gbps(r.get("peer_bytes", r["bytes_in"]), ms),
        _ratio(r.get("baseline_ms"), ms),
        NA,
    ]


def attention_rows(label: str, a: dict | None) -> list[list[str]]:
    """--pipeline G: UlyssesAttention's forward with pipeline=1 and with pipeline=G (ms, and
    the pipelined time against the plain one), or the error that stood in their place."""
    if a is None:
        return []
    name = f"UlyssesAttention pipeline={a['pipeline']} (forward, no grad)"
    if a["error"] is not None:
        return [[label, name, f"{NA}: {a['error'][:ERROR_CHARS]}", "", "", ""]]
    plain, piped = a["plain_ms"], a["pipelined_ms"]
    cost = NA if not plain or piped is None else f"{piped / plain:.2f}x plain's time"
    return [
        [
            label,
            "UlyssesAttention pipeline=1 (forward, no grad)",
            _ms(plain),
            NA,
            "1.00x plain's time",
            NA,
        ],
        [label, f"{name}, max |diff| {a['max_abs_diff']:.3g}", _ms(piped), NA, cost, NA],
    ]


def usp_rows(label: str, u: dict | None) -> list[list[str]]:
    """--ring-degree R: the plain attention and the one with ring steps (ms, and the ring's
    time against the plain one), or why the row was skipped, or the error in their place."""
    if u is None:
        return []
    if u["skipped"] or u["error"]:
        why = f"skipped: {u['skipped']}" if u["skipped"] else u["error"][:ERROR_CHARS]
        ring = u["ring_degree"]
        name = "USP ring x Ulysses" if ring is None else f"USP ring {ring}"
        return [[label, f"{name} (forward, no grad)", f"{NA}: {why}", "", "", ""]]
    plain, ring = u["plain_ms"], u["ring_ms"]
    cost = NA if not plain or ring is None else f"{ring / plain:.2f}x plain's time"
    return [
        [label, f"{u['plain']} (forward, no grad)", _ms(plain), NA, "1.00x plain's time", NA],
        [
            label,
            f"{u['ring']} (forward, no grad), max |diff| {u['max_abs_diff']:.3g}",
            _ms(ring),
            NA,
            cost,
            NA,
        ],
    ]


def wire_rows(label: str, w: dict | None, r: dict) -> list[list[str]]:
    """--wire: the copy and borrowed calls with FP8 on the wire (ms, GB/s over the caller's
    bytes, the time over the plain call's, host us), each with its largest error against the
    plain call's result (absolute, and over the input's amax), or the error in their place."""
    if w is None:
        return []
    name = f"FP8 wire {w['format']}"
    if w["error"] is not None:
        return [[label, name, f"{NA}: {w['error'][:ERROR_CHARS]}", "", "", ""]]
    out = []
    for call, plain_key in (("copy", "fast_copy_ms"), ("borrowed", "fast_borrowed_ms")):
        ms, plain, err = w[f"{call}_ms"], r[plain_key], w[f"{call}_max_abs_error"]
        amax = w["input_amax"]
        rel = f" ({err / amax:.3g} of amax)" if amax else ""
        cost = NA if not plain or ms is None else f"{ms / plain:.2f}x plain's time"
        host = w[f"{call}_host_us"]
        out.append(
            [
                label,
                f"{name} {call} (quantize + a2a + dequantize), max |err| {err:.3g}{rel}",
                _ms(ms),
                _gbps(r["bytes_in"], ms),
                cost,
                NA if host is None else f"{host:.1f}",
            ]
        )
    return out


def rows(results: dict) -> list[list[str]]:
    """One row per (case, mode, variant): ms, GB/s (bytes this rank sends / time), speedup
    against the permute + all_to_all_single + permute baseline, host us per call (per replay
    for the graph rows; a capture error stands in the ms column)."""
    out = []
    for entry in results["cases"]:
        r = entry["result"]
        base = r.get("baseline_ms")
        label = f"{entry['case']} m{entry['mode']}"
        variants = [
            ("baseline: permute + a2a + permute", base, r.get("baseline_host_us")),
            ("  permute in", r.get("permute_in_ms"), None),
            ("  raw all_to_all_single", r.get("raw_a2a_ms"), None),
            ("  permute out", r.get("permute_out_ms"), None),
            ("fast-ulysses copy", r["fast_copy_ms"], r["fast_copy_host_us"]),
            ("fast-ulysses borrowed", r["fast_borrowed_ms"], r["fast_borrowed_host_us"]),
            ("  own-share relayout (torch copy_)", r["own_share_ms"], None),
        ]
        for name, ms, host in variants:
            out.append(
                [
                    label,
                    name,
                    _ms(ms),
                    _gbps(r["bytes_in"], ms),
                    _ratio(base, ms),
                    NA if host is None else f"{host:.1f}",
                ]
            )
        out.append(
            [
                label,
                "  transfer = copy - own share (derived)",
                *transfer_cells(r, results["machine"]["world_size"]),
            ]
        )
        for name, ms, host, error in graph_rows(r):
            if error is not None:
                out.append([label, name, f"{NA}: {error[:ERROR_CHARS]}", "", "", ""])
                continue
            out.append(
                [
                    label,
                    name,
                    _ms(ms),
                    _gbps(r["bytes_in"], ms),
                    _ratio(base, ms),
                    NA if host is None else f"{host:.1f}",
                ]
            )
        f = r.get("fused")
        if f is not None:
            style = f"{f['norm']}, {f['rope_style']}"
            for name, ms, host in (
                (
                    f"fused norm + RoPE scatter ({style}; GB/s: read + write)",
                    f["fused_ms"],
                    f["fused_host_us"],
                ),
                ("  unfused: torch norm + RoPE, then borrowed", f["unfused_ms"], None),
                ("  plain borrowed (no norm, no RoPE)", f["plain_borrowed_ms"], None),
            ):
                nbytes = f["bytes_moved"] if name.startswith("fused") else r["bytes_in"]
                plain = f["plain_borrowed_ms"]
                cost = NA if not plain or ms is None else f"{ms / plain:.2f}x plain's time"
                out.append(
                    [
                        label,
                        name,
                        _ms(ms),
                        _gbps(nbytes, ms),
                        cost,
                        NA if host is None else f"{host:.1f}",
                    ]
                )
        out.extend(attention_rows(label, r.get("attention")))
        out.extend(usp_rows(label, r.get("usp")))
        out.extend(wire_rows(label, r.get("wire"), r))
        for key, name in (("baseline_overlap", "baseline"), ("fast_overlap", "fast copy")):
            out.append([label, f"overlap {name}", overlap_text(r.get(key)), "", "", ""])
    return out


def print_table(results: dict, console: Console | None = None) -> None:
    console = console or Console()
    m = results["machine"]
    title = f"fast-ulysses bench: P={m['world_size']} on {m['gpu']}" + (
        " - ranks share one GPU: not NVLink numbers" if m["shared_gpu"] else ""
    )
    table = Table(title=title)
    for column in ("case", "variant", "ms", "GB/s", "vs baseline", "host us/call"):
        table.add_column(column, justify="left" if column in ("case", "variant") else "right")
    for row in rows(results):
        table.add_row(*row)
    console.print(table)
    if results.get("baseline_note"):
        console.print(f"baseline: {results['baseline_note']}")
    for note in results.get("padding", []):
        console.print(f"padding: {note}")


def write_json(results: dict, out_dir: str | Path, label: str) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{label}.json"
    path.write_text(json.dumps(results, indent=2, default=str))
    return path


PLOT_MISSING = (
    "no plot: matplotlib is not installed (pip install 'fast-ulysses[plot]'); "
    "the table and the JSON are written all the same"
)


def write_plot(results: dict, path: str | Path) -> Path | None:
    """Stacked bars per case and mode: baseline stages against fast-ulysses copy (own share +
    the rest) and borrowed. Missing baselines are left out, never drawn as zero. Without
    matplotlib (the `plot` extra) it prints PLOT_MISSING to stderr and returns None."""
    try:
        import matplotlib
    except ImportError:
        print(PLOT_MISSING, file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["cases"]
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(cases)), 4.5))
    width = 0.27
    for i, entry in enumerate(cases):
        r = entry["result"]
        if r.get("baseline_ms") is not None:
            bottom = 0.0
            for key, color in (
                ("permute_in_ms", "#c44"),
                ("raw_a2a_ms", "#e88"),
                ("permute_out_ms", "#c44"),
            ):
                ax.bar(i - width, r[key], width, bottom=bottom, color=color)
                bottom += r[key]
        own = r["own_share_ms"]
        ax.bar(i, own, width, color="#48c")
        ax.bar(i, max(r["fast_copy_ms"] - own, 0.0), width, bottom=own, color="#8ae")
        ax.bar(i + width, r["fast_borrowed_ms"], width, color="#4a4")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{e['case']}\nmode {e['mode']}" for e in cases], fontsize=8)
    ax.set_ylabel("ms per call (slowest rank, median)")
    m = results["machine"]
    ax.set_title(
        f"P={m['world_size']}, {m['gpu']}"
        + (" - ranks share one GPU: not NVLink numbers" if m["shared_gpu"] else ""),
        fontsize=9,
    )
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color="#c44", label="baseline permutes"),
            Patch(color="#e88", label="baseline all_to_all_single"),
            Patch(color="#48c", label="fast: own share"),
            Patch(color="#8ae", label="fast copy: rest (derived)"),
            Patch(color="#4a4", label="fast borrowed"),
        ],
        fontsize=7,
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def slowest(per_rank: list[dict]) -> dict:
    """Element-wise max over ranks (the table reflects the slowest rank); booleans AND; text
    (an error every rank agreed on) the first rank's. An overlap record (it has `hidden`) is
    taken whole from the least hidden rank: its chain, times and spread belong together."""
    first = per_rank[0]
    out = {}
    for key, value in first.items():
        values = [r[key] for r in per_rank]
        if isinstance(value, bool):
            out[key] = all(values)
        elif isinstance(value, dict) and "hidden" in value:
            out[key] = min(values, key=_hidden_order)
        elif isinstance(value, dict):
            out[key] = slowest(values)
        else:  # None: not measured on that rank
            present = [v for v in values if v is not None]
            text = [v for v in present if isinstance(v, str)]
            out[key] = text[0] if text else (max(present) if present else None)
    return out


def _hidden_order(o: dict) -> float:
    return float("inf") if o["hidden"] is None else o["hidden"]
