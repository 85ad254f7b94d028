"""What `mlatrace bench splits` found, and its outputs: splits.md, splits.json, splits.png.

`Results` is filled by `mlatrace.bench.splits_bench`; nothing here measures.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Results:
    """Every measurement of one bench run (splits.json is this, as JSON)."""

    gpu: dict = field(default_factory=dict)
    read_ceiling_bytes_per_s: float = 0.0
    rows: list[dict] = field(default_factory=list)
    tuning: list[dict] = field(default_factory=list)
    stage2_tuning: list[dict] = field(default_factory=list)
    min_tiles: list[dict] = field(default_factory=list)
    pdl: list[dict] = field(default_factory=list)
    short: list[dict] = field(default_factory=list)
    contiguous: dict = field(default_factory=dict)
    gather_ceiling_bytes_per_s: float = 0.0
    contiguous_copy_bytes_per_s: float = 0.0
    stages_100k: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)


def row_line(row: dict, ceiling: float) -> str:
    """One length's line of the log."""
    cols = "  ".join(f"{name} {v['us']:9.1f}" for name, v in row["columns"].items())
    return (f"len {row['length']:>6}: {cols}  best {row['best_us']:8.1f} (S={row['best_splits']})"
            f"  device/best {row['device_over_best']:.3f}")


def write_json(out: Path, res: Results) -> None:
    """splits.json: every measurement, as the bench holds it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "splits.json").write_text(json.dumps(asdict(res), indent=1, default=str))


def markdown(res: Results) -> str:
    """The table of docs/benchmarks.md: per-call latency (us) by KV length and policy."""
    ceiling = res.read_ceiling_bytes_per_s
    lines = [
        f"GPU: {res.gpu.get('name', res.config.get('device'))}, batch 1, {res.config.get('nhead')}"
        f" heads, bf16, page size 1 (scattered pages), replayed from CUDA graphs; per-call us,"
        f" median. Read ceiling (1 GiB copy, read+write): {ceiling / 1e12:.2f} TB/s.",
        "",
        "| KV len | legacy@1 | fixed 128 | bucketed | device | best (S) | device/best |"
        " device/1-split |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in res.rows:
        c = row["columns"]
        lines.append(
            f"| {row['length']} | {c['legacy@1']['us']:.1f} | {c['fixed128']['us']:.1f} |"
            f" {c['bucketed']['us']:.1f} | {c['device']['us']:.1f} |"
            f" {row['best_us']:.1f} ({row['best_splits']}) | {row['device_over_best']:.3f} |"
            f" {row['device_over_one_split']:.3f} |")
    if res.rows:
        last = res.rows[-1]
        lines += ["", f"At {last['length']} tokens: device {last['device_bytes_per_s'] / 1e12:.2f}"
                  f" TB/s, best split {last['best_bytes_per_s'] / 1e12:.2f} TB/s"
                  + (f" ({last['device_bytes_per_s'] / ceiling:.0%} and"
                     f" {last['best_bytes_per_s'] / ceiling:.0%} of the read ceiling)"
                     if ceiling else "")
                  + f"; legacy@1 is {last['columns']['legacy@1']['us'] / last['columns']['device']['us']:.0f}x"
                  " the device policy."]
    if res.stages_100k:
        s = res.stages_100k
        lines.append(f"Device policy at {s['length']}: stage 1 {s['stage1_us']:.1f} us,"
                     f" stage 2 {s['stage2_us']:.1f} us ({s['splits']} splits launched).")
    if res.tuning:
        lines += ["", f"Tuning, device policy at {res.tuning[0]['length']} tokens (us per call;"
                  " stage 1 kernel and launch budget; inner tile, warps, stages and page-table"
                  " prefetch of the Triton kernel):", "",
                  "| stage 1 | budget | tile | warps | stages | prefetch | us | TB/s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for t in res.tuning:
            knobs = ("| - | - | - | - |" if t.get("kernel") == "gluon" else
                     f"| {t['tile_n']} | {t['warps']} | {t['stages']} | {int(t['prefetch'])} |")
            lines.append(f"| {t.get('kernel', 'triton')} | {t['budget']} {knobs}"
                         f" {t['us']:.1f} | {t['bytes_per_s'] / 1e12:.2f} |")
    if res.pdl:
        lines += ["", "Stage 2 as a programmatic dependent launch (PDL off / on for every policy):"
                  " " + "; ".join(f"{t['length']} {t['pdl']}: device {t['us']:.1f} us, best fixed"
                                  f" {t['best_fixed_us']:.1f} us (S={t['best_fixed_splits']})"
                                  for t in res.pdl)]
    if res.short:
        lines += ["", "Stage 2 split tiers, device policy (us per call): " + "; ".join(
            f"{t['length']} {t['label']} {t['us']:.1f}" for t in res.short)]
    if res.gather_ceiling_bytes_per_s:
        lines += ["", "Scattered-row ceiling (index_select of 100K permuted 1152-byte rows,"
                  f" read+write): {res.gather_ceiling_bytes_per_s / 1e12:.2f} TB/s; a"
                  f" contiguous copy of the same 115 MB: {res.contiguous_copy_bytes_per_s / 1e12:.2f}"
                  " TB/s."]
    if res.contiguous:
        c = res.contiguous
        lines += [f"Device policy at {c['length']} with a contiguous (identity) page table:"
                  f" {c['us']:.1f} us ({c['bytes_per_s'] / 1e12:.2f} TB/s)."]
    if res.stage2_tuning:
        lines += ["", "Stage 2 tile (max_block_s x block_dv): " + ", ".join(
            f"{t['block_s']}x{t['block_dv']} {t['us']:.1f} us" for t in res.stage2_tuning)]
    if res.min_tiles:
        lines += ["", "Device min tiles per split: " + "; ".join(
            f"{t['length']}: {t['min_tiles']} -> {t['us']:.1f} us" for t in res.min_tiles)]
    return "\n".join(lines) + "\n"


def plot(res: Results, path: Path) -> None:
    """splits.png: latency by length and policy, and each policy against the best split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [r["length"] for r in res.rows]
    columns = list(res.rows[0]["columns"]) if res.rows else []   # the policies, in order
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in columns:
        ax.plot(lengths, [r["columns"][name]["us"] for r in res.rows], marker="o", label=name)
    ax.plot(lengths, [r["best_us"] for r in res.rows], "k--", label="best split")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("KV length (tokens)")
    ax.set_ylabel("us per MLA decode call")
    ax.set_title(f"{res.gpu.get('name', 'CPU')}: replayed from CUDA graphs")
    ax.legend()
    for name in columns:
        ax2.plot(lengths, [r["columns"][name]["us"] / r["best_us"] for r in res.rows],
                 marker="o", label=name)
    ax2.axhline(1.05, color="grey", linestyle=":", label="best + 5%")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("KV length (tokens)")
    ax2.set_ylabel("time / best tuned split")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(out: Path, res: Results) -> None:
    """splits.json, splits.md and splits.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out, res)
    (out / "splits.md").write_text(markdown(res))
    plot(res, out / "splits.png")
