"""Summarise any `hires-hf ladder` RUNS file as a RESULTS.md section: the shape of every run read from its own
records (k, D, learning rate per architecture), mean final loss per size, and the scaling fit with its multiplier.

    python benchmarks/ladder_summary.py benchmarks/results/ladder_k4/runs.jsonl \
        --out benchmarks/results/ladder_k4.md --title "Ladder at k = 4, each architecture at its own learning rate"

The fit's figure goes next to the RUNS file (`scaling_fit.png`); report.py appends the section to RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from pathlib import Path

from hires_hf.eval.scaling import analyse, plot_fits, read_runs
from hires_hf.tables import markdown_row, markdown_table


def summary(runs_path: Path, title: str, command: str, trained_by: str | None = None) -> str:
    everything = [json.loads(line) for line in runs_path.read_text().splitlines() if line.strip()]
    records = [r for r in everything if r.get("fit", True)]  # sweep losers, rule checks, the MoE point: below
    fit = analyse(read_runs(runs_path), bootstrap=1000, seed=0)
    figure = plot_fits(fit, runs_path.parent / "scaling_fit.png")
    sizes = sorted({r["size"] for r in records}, key=lambda size: min(r["flops"] for r in records if r["size"] == size))
    archs = sorted({r["arch"] for r in records})
    rates = {arch: sorted({r["learning_rate"] for r in records if r["arch"] == arch}) for arch in archs}
    hires = next(r for r in records if r["arch"] == "hires")
    lines = [
        f"## {title}",
        "",
        f"Command: `{command}`, from the RUNS file written by `hires-hf ladder` ({len(records)} runs; "
        f"seeds per size: {len({r['seed'] for r in records})})"
        + (f"; the runs were trained by `{trained_by}`." if trained_by else "."),
        "",
        f"HiRes: D = {hires['residual_size'] // hires['hidden_size']}d, k = {hires['layers_per_block']}; peak learning "
        "rate " + ", ".join(f"{arch} {'/'.join(f'{lr:g}' for lr in rates[arch])}" for arch in archs) + ". "
        "At each size both architectures spend the same counted training FLOPs." + _twin_line(records),
        "",
        *markdown_table(
            ["size", "counted FLOPs", *(f"{arch} loss (mean of seeds)" for arch in archs)],
            align="lr" + "r" * len(archs),
        ),
    ]
    for size in sizes:
        of_size = [r for r in records if r["size"] == size]
        cells = [f"{statistics.mean(r['loss'] for r in of_size if r['arch'] == arch):.4f}" for arch in archs]
        lines.append(markdown_row([size, f"{statistics.mean(r['flops'] for r in of_size):.3g}", *cells]))
    laws = [(arch, f"{arch_fit.law.A:.4g}", f"{arch_fit.law.alpha:.4f}") for arch, arch_fit in fit.fits.items()]
    lines += ["", *markdown_table(["arch", "A", "alpha"], laws, align="lrr")]
    for multiplier in fit.multipliers:
        lines += [
            "",
            f"FLOPs-efficiency multiplier of {multiplier.arch} over {multiplier.baseline} at C = "
            f"{multiplier.at_compute:.3g}: **{multiplier.value:.3f}x** (95% CI {multiplier.ci_low:.3f}-"
            f"{multiplier.ci_high:.3f}).",
        ]
    lines += _protocol_lines(everything)
    relative = os.path.relpath(Path(figure).resolve(), Path(__file__).resolve().parent)  # RESULTS.md's folder
    return "\n".join([*lines, "", f"![{Path(figure).name}]({Path(relative).as_posix()})", ""])


def _twin_line(records: list[dict]) -> str:
    """Which baseline `vanilla` is: the control with HiRes's embedding scale (the ladder's default since it runs on
    the experiment harness), or the twin transformers builds (older RUNS files)."""
    multipliers = {r.get("twin_embedding_multiplier") for r in records if r["arch"] == "vanilla"}
    has_plain = any(r["arch"] == "plain-twin" for r in records)
    plain = " `plain-twin` is transformers' twin as it ships." if has_plain else ""
    if multipliers == {None}:
        return " `vanilla` is the plain transformers twin (no control in these runs)." + plain
    shown = "/".join(f"{m:g}" for m in sorted(m for m in multipliers if m))
    return (
        f" `vanilla` is the control: the Llama twin with its embeddings multiplied by {shown} in the forward, as "
        "HiRes's are." + plain
    )


def _protocol_lines(records: list[dict]) -> list[str]:
    """The learning-rate sweep, the check of the width rule and the MoE point, where the ladder ran them."""
    lines = []
    extra = [r for r in records if r.get("role") in ("sweep", "rule-check", "rate-check", "moe")]
    if not extra:
        return lines
    lines += [
        "",
        *markdown_table(["role", "size", "arch", "peak lr", "steps", "tokens", "final loss"], align="lllrrrr"),
    ]
    for r in extra:
        loss = f"{r['loss']:.4f}" if "error" not in r else f"failed: {r['error']}"
        role = f"{r['role']} ({r['bracket']})" if r.get("bracket") else r["role"]
        cells = [role, r["size"], r["arch"], f"{r['learning_rate']:.3g}", r.get("steps", ""), f"{r.get('tokens', 0):,}"]
        lines.append(markdown_row([*cells, loss]))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default="Scaling ladder")
    parser.add_argument("--trained-by", help="the `hires-hf ladder` command that wrote the RUNS file")
    args = parser.parse_args()
    command = shlex.join(["python", "benchmarks/ladder_summary.py", *sys.argv[1:]])
    text = summary(args.runs, args.title, command, args.trained_by)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
