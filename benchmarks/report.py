"""Turn the saved measurements under `benchmarks/results/` into `benchmarks/RESULTS.md` and its figures.

Nothing in RESULTS.md is typed by hand. `results/` holds one folder an experiment: the compute ladder
(`ladder/ladder.md`, written by `hires-hf ladder --report`), the design sweep (`sweep/<shape>/sweep.md`, which
decided the defaults), `cost/cost.json` and `gpu/gpu.json` (written by `python -m benchmarks`), the stability
grids, and every other
experiment's markdown; `archive/` keeps superseded runs, listed at the end. Each section names the command,
machine and library versions that produced it, since sections may come from different runs.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hires_hf.experiments.runs import cpu_name
from hires_hf.io import write_json_atomic, write_text_atomic
from hires_hf.plotting import pyplot
from hires_hf.tables import markdown_table

BENCHMARKS_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCHMARKS_DIR / "results"
MIB = 2**20


# ---------------------------------------------------------------------------------------------- provenance
def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as a user would retype it (`python -m benchmarks ...`, `python benchmarks/x.py ...`)."""
    argv = list(sys.argv if argv is None else argv)
    program = Path(argv[0]).name if argv else "python"
    if program == "__main__.py":
        program = "python -m benchmarks"
    return " ".join([program, *map(shlex.quote, argv[1:])])


def environment() -> dict[str, Any]:
    """Machine, library versions and load: what a reader needs to judge a timing."""
    import torch
    import transformers

    env = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "git_commit": _git(["rev-parse", "--short", "HEAD"]),
        "git_dirty": bool(_git(["status", "--porcelain", "--untracked-files=no"])),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


def _git(args: list[str]) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=BENCHMARKS_DIR, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# ---------------------------------------------------------------------------------------------- files
def save_json(path: Path, data: dict[str, Any]) -> None:
    write_json_atomic(path, data, indent=1)


def load_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def save_figure(figure, path: Path) -> None:
    """Save a matplotlib figure through a temporary file, then close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".png", delete=False) as handle:
        figure.savefig(handle, format="png", dpi=110, bbox_inches="tight")
    os.replace(handle.name, path)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------- formatting
def _provenance(section: dict[str, Any]) -> str:
    env = section["environment"]
    gpu = f", GPU {env['gpu']} (CUDA {env['cuda']})" if env.get("gpu") else ""
    dirty = " + uncommitted changes" if env.get("git_dirty") else ""
    return (
        f"Command: `{section['command']}` ({env['date_utc']}, commit {env['git_commit'] or '?'}{dirty}).\n"
        f"Machine: {env['cpu']}, {env['cpu_count']} CPUs, {env['platform']}{gpu}; "
        f"Python {env['python']}, torch {env['torch']}, transformers {env['transformers']}; "
        f"{env['torch_threads']} torch thread(s); 1-min load average {env['load_average_1min']:.1f} at start"
        + (f", {section['load_average_end']:.1f} at end." if section.get("load_average_end") is not None else ".")
    )


def _ratio(stats: dict[str, float]) -> str:
    return f"{stats['median']:.3f} [{stats['min']:.3f}-{stats['max']:.3f}]"


def _met(verdict: dict[str, Any]) -> str:
    return "met" if verdict["met"] else "**not met**"


def render_cost(cost: dict[str, Any], figures: list[str]) -> str:
    """The cost section: settings, the side-by-side table, target verdicts, where memory and time go."""
    s, summary = cost["settings"], cost["summary"]
    lines = [
        "## Cost half",
        "",
        _provenance(cost),
        "",
        f"Shape shared by every row: d={s['hidden_size']}, L={s['num_layers']}, {s['num_heads']} heads, SwiGLU width "
        f"{s['ffn_width']}, vocab {s['vocab_size']}, batch {s['batch_size']} x {s['seq_len']} tokens, float32, "
        f"sdpa attention. MoE rows: {s['num_experts']} experts, top-{s['experts_per_tok']}, expert width "
        f"{s['expert_width']}, `{s['experts_implementation']}` experts kernel for OLMoE and HiRes alike. "
        f"Peers (dense only): mHC with {s['peer_streams']} streams and Block AttnRes with a block of "
        f"{s['peer_block_size']} layers, each wired around transformers' own Llama layers (see `benchmarks/peers.py`).",
        "",
        f"Timing: {s['repeats']} repetitions after {s['warmup']} warm-up; in each, every row (in a fresh random "
        "order) is timed right next to its family's vanilla row, which goes first every other time, so the "
        "vanilla row's own min / median are over all its runs. A step is forward + LM loss + backward "
        "(no optimizer). Decode: greedy, KV cache, "
        f"{s['decode_tokens']} one-token steps after a {s['prompt_len']}-token prefill, batch {s['batch_size']}. "
        "Ratios are over those adjacent pairs: median [min-max]. "
        "FLOPs: forward, per token; *analytic* is `hires_hf.accounting` (peers: vanilla + the mechanism's "
        "matmuls), *counted* is `torch.utils.flop_counter.FlopCounterMode` with formulas for CPU sdpa "
        "(causal pairs only) and grouped matmuls added. Activations: bytes autograd keeps for backward "
        "(`saved_tensors_hooks`, distinct storages, parameters excluded).",
        "",
        *markdown_table(
            [
                "row",
                "params",
                "FLOPs/token counted",
                "analytic",
                "overhead",
                "step s min / median",
                "step ratio",
                "decode tok/s median",
                "decode ratio",
                "activations MiB",
                "act. ratio",
            ],
            align="l" + "r" * 10,
        ),
    ]
    for row in cost["rows"]:
        stats = summary[row["name"]]
        train, decode = stats["train_seconds"], stats["decode_tokens_per_second"]
        lines.append(
            f"| {row['name']} | {row['params']:,} | {row['counted_flops']:,.0f} | {row['analytic_flops']:,.0f} | "
            f"{row['analytic_overhead']:+.1%} | {train['min']:.3f} / {train['median']:.3f} | "
            f"{_ratio(stats['train_ratio'])} | {decode['median']:.1f} | {_ratio(stats['decode_ratio'])} | "
            f"{row['activation_bytes'] / MIB:.1f} | {stats['activation_ratio']:.3f} |"
        )
    verdicts = cost["targets"]
    met = sum(v["met"] for v in verdicts)
    lines += [
        "",
        f"### Targets: {met} of {len(verdicts)} met",
        "",
        "Time targets are judged on the median ratio over the adjacent (row, vanilla) pairs; the spread is in the "
        "table above.",
        "",
        *markdown_table(
            ["target", "row", "value", "limit", "verdict", "for reference"],
            [
                (
                    v["target"],
                    v["row"],
                    f"{v['value']:.3f}",
                    f"{v['relation']} {v['limit']:.3f}",
                    _met(v),
                    v.get("note", ""),
                )
                for v in verdicts
            ],
            align="llrrll",
        ),
    ]
    decode_misses = [v for v in verdicts if v["target"].startswith("decode") and not v["met"]]
    if decode_misses:
        rows = {row["name"]: row for row in cost["rows"]}
        above = sum(v["value"] >= 1 / (1 + rows[v["row"]]["analytic_overhead"]) for v in decode_misses)
        lines += [
            "",
            f"Of the {len(decode_misses)} missed decode targets, {above} sit at or above 1/(1 + analytic FLOPs "
            "overhead), the ratio a decoder limited by its matmuls (or by reading their weights) would reach.",
        ]
    lines += ["", *render_activation_split(cost), ""]
    if cost.get("profiles"):
        lines += render_profiles(cost["profiles"])
    if not any(not v["met"] for v in verdicts if v["target"].startswith(("step", "decode"))):
        lines += ["No time target was missed, so no profile was taken.", ""]
    lines += [f"![{name}](results/cost/{name})" for name in figures]
    return "\n".join(lines) + "\n"


def render_activation_split(cost: dict[str, Any], top: int = 8) -> list[str]:
    """Where the saved bytes live, for vanilla, HiRes at D = 2d, k = 4, and the peers."""
    wanted = [r for r in cost["rows"] if r["kind"] in ("vanilla", "mhc", "attnres")]
    wanted += [r for r in cost["rows"] if r["layers_per_block"] == 4 and r["width_factor"] == 2]
    lines = ["### Where the activation memory goes (MiB kept for backward, largest module kinds)", ""]
    for row in wanted:
        split = sorted(row["activation_by_module"].items(), key=lambda item: -item[1])[:top]
        parts = ", ".join(f"`{name}` {size / MIB:.2f}" for name, size in split)
        lines.append(f"- {row['name']} ({row['activation_bytes'] / MIB:.1f} MiB): {parts}")
    return lines


def render_profiles(profiles: list[dict[str, Any]]) -> list[str]:
    """torch.profiler comparisons recorded for rows that missed a time target."""
    lines = []
    for entry in profiles:
        lines += [
            f"### Where the time goes: {entry['row']} vs {entry['reference']}, {entry.get('what', 'train step')}"
            " (self CPU ms per call, torch.profiler, ops that grow most)",
            "",
            *markdown_table(
                ["op", f"{entry['reference']} ms", f"{entry['row']} ms", "extra ms"],
                [(f"`{op}`", f"{ref:.2f}", f"{ms:.2f}", f"{ms - ref:+.2f}") for op, ref, ms in entry["ops"]],
                align="lrrr",
            ),
            "",
        ]
    return lines


def cost_figures(cost: dict[str, Any], results_dir: Path) -> list[str]:
    """One figure: step-time, decode and activation ratios per row, with each row's target drawn in."""
    plt = pyplot()

    rows = [r for r in cost["rows"] if r["kind"] != "vanilla"]
    summary = cost["summary"]
    names = [r["name"] for r in rows]
    positions = range(len(rows))
    figure, axes = plt.subplots(1, 3, figsize=(15, 0.35 * len(rows) + 1.5), sharey=True)
    panels = [
        ("train_ratio", "step time / vanilla (median, min-max)"),
        ("decode_ratio", "decode tokens/s / vanilla (median, min-max)"),
    ]
    for axis, (key, title) in zip(axes, panels):
        medians = [summary[n][key]["median"] for n in names]
        low = [summary[n][key]["median"] - summary[n][key]["min"] for n in names]
        high = [summary[n][key]["max"] - summary[n][key]["median"] for n in names]
        axis.barh(positions, medians, xerr=[low, high], color="tab:blue", alpha=0.7)
        axis.set_title(title, fontsize=9)
    limits = [1.0 + r["analytic_overhead"] + (0.05 if r["family"] == "moe" else 0.03) for r in rows]
    axes[0].scatter(limits, positions, marker="|", s=200, color="tab:red", label="target")
    axes[0].legend(fontsize=8)
    axes[1].axvline(0.95, color="tab:red", linestyle="--", label="target 0.95")
    axes[1].legend(fontsize=8)
    axes[2].barh(positions, [summary[n]["activation_ratio"] for n in names], color="tab:green", alpha=0.7)
    axes[2].axvline(1.10, color="tab:red", linestyle="--", label="target 1.10 (D=2d, k=4)")
    axes[2].set_title("activation bytes / vanilla", fontsize=9)
    axes[2].legend(fontsize=8)
    axes[0].set_yticks(list(positions), names, fontsize=8)
    axes[0].invert_yaxis()
    for axis in axes:
        axis.axvline(1.0, color="gray", linewidth=0.8)
    save_figure(figure, results_dir / "cost_ratios.png")
    return ["cost_ratios.png"]


def render_gpu(gpu: dict[str, Any]) -> str:
    """The GPU section: bf16 training throughput and MFU, HiRes next to its vanilla twin."""
    lines = ["## GPU: bf16 training throughput and MFU", "", _provenance(gpu), ""]
    if gpu.get("skipped"):
        return "\n".join([*lines, gpu["skipped"], ""])
    s = gpu["settings"]
    lines += [
        f"Batch {s['batch_size']} x {s['seq_len']} tokens, bf16 weights, forward + backward (no optimizer), "
        f"{s['steps']} timed steps after {s['warmup']} warm-up. MFU = tokens/s x analytic train FLOPs per token "
        f"(3 x forward, causal) / peak {gpu['peak_tflops']:.0f} TFLOP/s ({gpu['peak_source']}).",
        "",
        *markdown_table(
            ["shape", "attention", "model", "params", "tokens/s", "MFU", "peak memory GiB"], align="lllrrrr"
        ),
    ]
    for row in gpu["rows"]:
        lines.append(
            f"| {row['shape']} | {row['attention']} | {row['model']} | {row['params']:,} | "
            f"{row['tokens_per_second']:,.0f} | {row['mfu']:.1%} | {row['peak_memory_bytes'] / 2**30:.1f} |"
        )
    if gpu.get("not_run"):
        lines += ["", *[f"- not run: {reason}" for reason in gpu["not_run"]]]
    targets = [
        ("HiRes MFU within 3 points", v["row"], f"{v['value'] * 100:+.2f} points", _met(v)) for v in gpu["targets"]
    ]
    lines += [
        "",
        *markdown_table(["target", "shape / attention", "HiRes MFU minus vanilla MFU", "verdict"], targets, "llrl"),
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- assembly
# One folder an experiment under results/; these have sections of their own, in this order, every other folder's
# markdown follows, and results/archive/ (superseded runs) is listed at the end.
OWN_SECTIONS = ("ladder", "sweep", "cost", "gpu", "stability")
LADDER_FRAGMENT = "ladder/ladder.md"
LINK = re.compile(r"(\]\()(?![a-z]+:|/|#)([^)]+)\)")  # a relative link or image: `](figure.png)`


def demoted(text: str) -> str:
    """Every heading one level down; a line in a code block that starts with `#` (a shell comment) is not one."""
    lines, in_code = [], False
    for line in text.splitlines():
        in_code ^= line.startswith("```")
        lines.append("#" + line if line.startswith("#") and not in_code else line)
    return "\n".join(lines)


def fragment(path: Path, results_dir: Path) -> str:
    """A markdown file an experiment wrote, as a section of RESULTS.md: its links made relative to RESULTS.md
    (each file links its figures from its own folder), a top-level `# Title` demoted to `## Title`."""
    folder = path.parent.relative_to(results_dir.parent).as_posix()
    text = LINK.sub(lambda m: f"{m[1]}{folder}/{m[2]})", path.read_text().strip())
    if text.startswith("# "):
        text = demoted(text)
    elif not text.startswith("## "):
        text = f"## From `{path.relative_to(results_dir.parent).as_posix()}`\n\n{text}"
    return text + "\n"


def archive_lines(results_dir: Path) -> list[str]:
    """One line a superseded run: its title, linked."""
    entries = sorted((results_dir / "archive").glob("*/*.md"))
    if not entries:
        return []
    lines = [
        "## Archive: superseded runs",
        "",
        "Measured with defaults or baselines since replaced (see each file, and docs/history.md); kept, not read.",
        "",
    ]
    for path in entries:
        title = next((line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#")), path.stem)
        lines.append(f"- [{title}]({path.relative_to(results_dir.parent).as_posix()})")
    return [*lines, ""]


def write_results(benchmarks_dir: Path = BENCHMARKS_DIR) -> Path:
    """Assemble RESULTS.md from every experiment under results/; sections never run say how to run them."""
    results_dir = benchmarks_dir / "results"
    cost, gpu = load_json(results_dir / "cost" / "cost.json"), load_json(results_dir / "gpu" / "gpu.json")
    parts = [
        "# HiRes benchmarks",
        "",
        "Written by `benchmarks/report.py` from `benchmarks/results/` (one folder an experiment); do not edit by "
        "hand, rerun `python -m benchmarks` from the repository root. Timings on a shared CPU are noisy: read the "
        "ratios with their spread. The baseline is the *control*, the Llama twin with HiRes's embedding scale; "
        "the *plain twin* is that Llama as transformers ships it.",
        "",
    ]
    ladder = results_dir / LADDER_FRAGMENT
    parts.append(
        fragment(ladder, results_dir)
        if ladder.is_file()
        else "## Compute ladder\n\nNot reported yet: `hires-hf ladder --workers 2`, then `hires-hf ladder --report`.\n"
    )
    sweeps = sorted((results_dir / "sweep").glob("*/sweep.md"))
    parts += [fragment(path, results_dir) for path in sweeps] or [
        "## Design sweep\n\nNot run yet: `python -m benchmarks.sweep` (see its docstring).\n"
    ]
    if cost:
        parts.append(render_cost(cost, cost_figures(cost, results_dir / "cost")))
    else:
        parts.append("## Cost half\n\nNot run yet: `python -m benchmarks --only cost`.\n")
    parts.append(
        render_gpu(gpu) if gpu else "## GPU\n\nNot run yet: `python -m benchmarks --only gpu` on a CUDA machine.\n"
    )
    parts += [fragment(path, results_dir) for path in sorted((results_dir / "stability").glob("*.md"))]
    for folder in sorted(path for path in results_dir.iterdir() if path.is_dir()):
        if folder.name not in (*OWN_SECTIONS, "archive"):
            parts += [fragment(path, results_dir) for path in sorted(folder.glob("*.md"))]
    parts += archive_lines(results_dir)
    path = benchmarks_dir / "RESULTS.md"
    write_text_atomic(path, "\n".join(parts))
    return path


__all__ = ["command_line", "environment", "load_json", "save_json", "write_results", "write_text_atomic"]
