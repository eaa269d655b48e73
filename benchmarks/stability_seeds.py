"""The stability grid over seeds: is the gap between HiRes and the control larger than what another seed changes?

Reads stability grids of the same shape run under different seeds (`python benchmarks/stability.py --seed N`),
puts each (architecture, learning rate)'s final losses side by side with their mean and spread, and applies the
three stability checks to the means (`stability.checks_lines`), counting a rate as "on the plateau" when any seed
is. Writes a table and a PNG of final loss against learning rate (one line per architecture through the means,
a dot per seed).

    python -m benchmarks.stability_seeds   # stability.json + stability_seed1.json -> stability_seeds.{md,png}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from hires_hf.io import write_text_atomic
from hires_hf.tables import markdown_row, markdown_table

from .stability import LABELS, RESULTS, VARIANTS, checks_lines, load_payload


def load(paths: list[Path]) -> list[dict[str, Any]]:
    """The grids' payloads, checked to be one experiment: same unigram loss (same data) and shape."""
    payloads = [load_payload(path) for path in paths]  # arch names of older files made current
    shapes = {json.dumps(p["settings"]["shape"], sort_keys=True) for p in payloads}
    if len(shapes) > 1 or len({round(p["unigram_loss"], 9) for p in payloads}) > 1:
        raise SystemExit("error: these grids differ in shape or data; pass grids of one preset run under other seeds")
    return payloads


def by_cell(payloads: list[dict[str, Any]]) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """(arch, lr) -> that cell's run in each grid that has it."""
    cells: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for payload in payloads:
        for run in payload["runs"]:
            cells.setdefault((run["arch"], run["lr"]), []).append(run)
    return cells


def mean_runs(cells: dict[tuple[str, float], list[dict[str, Any]]], seeds: int) -> list[dict[str, Any]]:
    """One run per cell that every seed has: mean final loss, on the plateau if any seed is."""
    return [
        {
            "arch": arch,
            "lr": lr,
            "final_loss": statistics.fmean(r["final_loss"] for r in runs),
            "plateau": any(r["plateau"] for r in runs),
        }
        for (arch, lr), runs in cells.items()
        if len(runs) == seeds
    ]


def markdown(payloads: list[dict[str, Any]], paths: list[Path], figure: str) -> str:
    seeds = [p["settings"]["seed"] for p in payloads]
    cells = by_cell(payloads)
    archs = [a for a in VARIANTS if any(arch == a for arch, _ in cells)]
    shape = payloads[0]["settings"]["shape"]
    lines = [
        "## Stability over seeds",
        "",
        f"`python -m benchmarks.stability_seeds {' '.join(p.name for p in paths)}`: seeds {seeds}, "
        f"d={shape['hidden_size']}, "
        f"L={shape['num_hidden_layers']}, {payloads[0]['settings']['vanilla_steps']} vanilla steps, matched counted "
        f"FLOPs; unigram loss {payloads[0]['unigram_loss']:.3f}. Each cell: the seeds' final validation losses, "
        "then their mean ± half the range (* = on the plateau).",
        "",
        *markdown_table(["peak lr", *(LABELS.get(a, a) for a in archs)]),
    ]
    for lr in sorted({lr for _, lr in cells}):
        row = []
        for arch in archs:
            runs = cells.get((arch, lr), [])
            losses = [f"{r['final_loss']:.3f}{'*' if r['plateau'] else ''}" for r in runs]
            values = [r["final_loss"] for r in runs]
            spread = (
                f" → {statistics.fmean(values):.3f} ± {(max(values) - min(values)) / 2:.3f}" if len(runs) > 1 else ""
            )
            row.append(" / ".join(losses) + spread if runs else "-")
        lines.append(markdown_row([f"{lr:g}", *row]))
    lines += checks_lines(mean_runs(cells, len(payloads)), on=" on the means (a rate is on the plateau if any seed is)")
    return "\n".join([*lines, "", f"![final loss against learning rate over seeds](results/{figure})", ""])


def plot(payloads: list[dict[str, Any]], path: Path) -> Path:
    cells = by_cell(payloads)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arch in [a for a in VARIANTS if any(arch == a for arch, _ in cells)]:
        rates = sorted(lr for a, lr in cells if a == arch)
        means = [statistics.fmean(r["final_loss"] for r in cells[arch, lr]) for lr in rates]
        (line,) = ax.plot(rates, means, marker="o", label=LABELS.get(arch, arch))
        for lr in rates:
            losses = [r["final_loss"] for r in cells[arch, lr]]
            ax.scatter([lr] * len(losses), losses, color=line.get_color(), s=12, alpha=0.5)
    ax.axhline(payloads[0]["unigram_loss"], color="grey", linestyle=":", label="unigram loss")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss (nats/token)")
    ax.set_title(f"Final loss over seeds {[p['settings']['seed'] for p in payloads]} at matched counted FLOPs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = [RESULTS / "stability.json", RESULTS / "stability_seed1.json"]
    parser.add_argument("grids", nargs="*", type=Path, default=default, help="grid JSONs (default: seeds 0 and 1)")
    parser.add_argument("--name", default="stability_seeds", help="file name of the outputs")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.grids if not path.is_file()]
    if missing:
        raise SystemExit(f"error: no grid at {', '.join(missing)}; run `python benchmarks/stability.py --seed N` first")
    payloads = load(args.grids)
    out_dir = args.grids[0].parent
    plot(payloads, out_dir / f"{args.name}.png")
    text = markdown(payloads, args.grids, f"{args.name}.png")
    write_text_atomic(out_dir / f"{args.name}.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
