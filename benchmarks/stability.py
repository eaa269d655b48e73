"""Stability: does HiRes leave the unigram plateau at every learning rate where the vanilla baseline learns?

Each architecture trains over a grid of peak learning rates at matched counted training FLOPs (HiRes pays for
its projections with fewer steps), on the same batches, through the experiment harness
(`hires_hf.experiments.harness`: its data path, shape rule, FLOP budget and loop). The architectures:

- `control`: the baseline, the Llama twin with HiRes's embedding scale (x 1/initializer_range in its forward),
  the strongest simple vanilla;
- `plain-twin`: the transformers twin (Llama) as it ships, a second row;
- `hires`: HiRes with the package's defaults;
- `hires-old-default`: HiRes as it shipped before the stability fix (`embedding_multiplier=1.0`,
  `write_norm=False`, `write_multiplier=1.0`); `--ablation` adds the fix's parts alone;
- `hires-D=d`, `hires-D=4d`, `hires-k2`, `hires-k8`: the defaults with another stream width D or block size k.

A run is "on the plateau" when its final validation loss is within 0.2 nats of the unigram cross-entropy of
the validation data (what a model that ignores its input reaches). Writes a table, the acceptance checks
(HiRes learns wherever the baseline does, and at least as well; against the control, then the plain twin) and
a PNG of validation loss against steps per learning rate. `--over-seeds` puts grids of one shape run under
other seeds side by side: each cell's losses, their mean and spread, and the checks applied to the means.

    python benchmarks/stability.py                 # CPU: d=128, L=16, k=4 (4 blocks); ~20 minutes on 2 cores
    python benchmarks/stability.py --preset d192   # the d=192 CPU reproduction of the stall: 32 x 128 batches; ~60 min
    python benchmarks/stability.py --seed 1        # the CPU grid again with other weights and batches
    python benchmarks/stability.py --width 64      # the CPU grid at another width (write multiplier 64/d)
    python benchmarks/stability.py --extend --lrs 8e-3   # add cells to a grid already written (same options)
    python benchmarks/stability.py --preset gpu    # one GPU: d=512, L=16, 12M vanilla tokens a run
    python benchmarks/stability.py --map           # where the old default stalls: width, blocks, batch, dtype
    python benchmarks/stability.py --ablation      # each part of the fix alone, up to lr 1.6e-2
    python benchmarks/stability.py --over-seeds    # stability.json + stability_seed1.json -> stability_seeds
    python benchmarks/stability.py --smoke         # seconds: tests

Writes benchmarks/results/stability/stability[_d192|_gpu|_map|_seeds][_dD][_seedN].{md,json,png} (or under
--out-dir).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from hires_hf.diagnostics import DiagnosticsRecorder
from hires_hf.experiments.harness import (
    Arm,
    Budget,
    Data,
    Shape,
    baseline_arms,
    bracket_status,
    plan_budget,
    prepare_data,
    train_run,
)
from hires_hf.io import write_json_atomic, write_text_atomic
from hires_hf.plotting import pyplot
from hires_hf.tables import markdown_row, markdown_table
from hires_hf.training.loop import pick_device

RESULTS = Path(__file__).resolve().parent / "results" / "stability"
CONTROL, PLAIN = (arm.name for arm in baseline_arms(plain=True))  # "control", "plain-twin"
# Every architecture by name: the baselines, then HiRes variants by the config fields that differ from the
# defaults (`residual_ratio` is D / d).
VARIANTS: dict[str, Arm] = {
    arm.name: arm
    for arm in (
        *baseline_arms(plain=True),
        Arm("hires"),
        Arm("hires-old-default", fields={"embedding_multiplier": 1.0, "write_norm": False, "write_multiplier": 1.0}),
        Arm("hires-embedding-fix-only", fields={"write_norm": False, "write_multiplier": 1.0}),
        Arm("hires-no-write-multiplier", fields={"write_multiplier": 1.0}),
        Arm("hires-write-multiplier-1/4", fields={"write_multiplier": 0.25}),
        Arm("hires-D=d", fields={"residual_ratio": 1.0}),
        Arm("hires-D=4d", fields={"residual_ratio": 4.0}),
        Arm("hires-k2", fields={"layers_per_block": 2}),
        Arm("hires-k8", fields={"layers_per_block": 8}),
    )
}
BASELINES = (CONTROL, PLAIN)  # checked against in this order: the control is the baseline
LABELS = {CONTROL: "control", PLAIN: "plain twin"}  # table headers
ARCHS = (CONTROL, PLAIN, "hires", "hires-old-default")
# The ablation at the CPU shape (d=128, where the write multiplier was 1 when this ran, under the base width 128
# of the time): the embedding fix alone at the grid's rate and at 1e-2 (where the write norm is needed), and at
# 1.6e-2 that rule's write multiplier of d=512 (128/512 = 1/4): lr * d * multiplier is the same as at d=512 and
# lr 4e-3, the GPU stall the multiplier removes.
ABLATION_CELLS = (
    (3e-3, "hires-embedding-fix-only"),
    (3e-3, "hires-write-multiplier-1/4"),
    (1e-2, CONTROL),
    (1e-2, PLAIN),
    (1e-2, "hires-embedding-fix-only"),
    (1e-2, "hires"),
    (1.6e-2, CONTROL),
    (1.6e-2, PLAIN),
    (1.6e-2, "hires"),
    (1.6e-2, "hires-write-multiplier-1/4"),
)
PLATEAU_MARGIN = 0.2  # nats below the unigram cross-entropy a run must reach to count as learning


@dataclass(frozen=True)
class StabilitySettings:
    """One grid; `vanilla_steps` fixes the budget: that many steps of the vanilla twin's counted FLOPs a run."""

    shape: Shape = field(default_factory=Shape)  # d=128, L=16, k=4, D=2d, heads of 64, vocab 4096
    learning_rates: tuple[float, ...] = (1e-3, 2e-3, 3e-3, 4e-3)
    archs: tuple[str, ...] = ARCHS
    block_size: int = 128
    batch_size: int = 16
    vanilla_steps: int = 120
    corpus: str = "stdlib"
    max_chars: int = 12_000_000
    validation_fraction: float = 0.01
    eval_blocks: int = 64
    evaluations: int = 8
    diagnostics_every: int = 10
    old_lrs: tuple[float, ...] | None = None  # rates for hires-old-default (None: the whole grid)
    cells: tuple[tuple[float, str], ...] | None = None  # explicit (lr, arch) runs instead of the grid
    device: str = "auto"
    precision: str = "auto"  # bf16 autocast on CUDA, fp32 on the CPU; "bf16" forces it anywhere
    seed: int = 0

    @classmethod
    def gpu(cls) -> StabilitySettings:
        """The GPU shape where the stall was first seen: d=512, L=16, 8 heads x 64, SwiGLU 1408, vocab 8192,
        batches of 64 x 1024, 12M vanilla tokens a run (183 steps), Python sources (stdlib + site-packages)."""
        return cls(
            shape=Shape(hidden_size=512, intermediate_size=1408, vocab_size=8192),
            learning_rates=(5e-4, 1e-3, 2e-3, 4e-3),
            block_size=1024,
            batch_size=64,
            vanilla_steps=183,
            corpus="python",
            max_chars=60_000_000,
            eval_blocks=64,
            diagnostics_every=20,
            old_lrs=(1e-3, 2e-3),  # where the old default stalled at this shape; keeps the grid under 8 minutes
        )

    @classmethod
    def d192(cls) -> StabilitySettings:
        """The CPU reproduction of the stall: d=192, L=16, 3 heads x 64, vocab 4096, batches of 32 x 128, 0.6M vanilla
        tokens a run (146 steps), Python sources; the old default only at 3e-3, where it stalled first."""
        return cls(
            shape=Shape(hidden_size=192, vocab_size=4096),
            batch_size=32,
            vanilla_steps=146,
            corpus="python",
            old_lrs=(3e-3,),
        )

    @classmethod
    def smoke(cls) -> StabilitySettings:
        return cls(
            shape=Shape(hidden_size=32, num_hidden_layers=4, layers_per_block=2, head_dim=16, vocab_size=300),
            learning_rates=(1e-3, 3e-3),
            block_size=32,
            batch_size=4,
            vanilla_steps=6,
            max_chars=150_000,
            validation_fraction=0.05,
            eval_blocks=4,
            evaluations=2,
            diagnostics_every=3,
            device="cpu",
        )


def prepare(settings: StabilitySettings, progress: bool = True) -> Data:
    """The harness's data path: one corpus, one tokenizer, packed blocks, the validation slice's unigram loss."""
    return prepare_data(
        settings.corpus,
        settings.shape.vocab_size,
        settings.block_size,
        settings.max_chars,
        settings.validation_fraction,
        settings.eval_blocks,
        progress=progress,
    )


def budget(settings: StabilitySettings, data: Data) -> Budget:
    """`vanilla_steps` steps of the twin's counted FLOPs (a hair more, so that float rounding never takes the
    twin's last step away); an arm that costs more per token gets fewer steps."""
    planned = plan_budget(VARIANTS[PLAIN], settings.shape, data, settings.batch_size, steps=settings.vanilla_steps)
    return Budget(planned.flops * (1 + 1e-9), settings.batch_size)


def run_one(arch: str, lr: float, settings: StabilitySettings, data: Data, device: torch.device) -> dict[str, Any]:
    """One architecture at one peak rate through the harness's `train_run`; diagnostics every few steps."""
    recorder = DiagnosticsRecorder(data.validation[:8].to(device), every=settings.diagnostics_every, entropy=False)
    run = train_run(
        VARIANTS[arch],
        lr,
        settings.shape,
        data,
        budget(settings, data),
        seed=settings.seed,
        device=device,
        evaluations=settings.evaluations,
        precision=settings.precision,
        before_update=recorder.before_step,
        after_update=recorder.after_step,
    )
    per_step = run.flops_per_token * settings.batch_size * data.context
    return {
        "arch": arch,
        "lr": lr,
        "steps": run.steps,
        "flops": run.steps * per_step,
        "flops_per_token": run.flops_per_token,
        "final_loss": run.final_loss,
        "plateau": not run.final_loss < data.unigram_loss - PLATEAU_MARGIN,
        "curve": [(round(flops / per_step), loss) for flops, loss in run.curve],  # (step, validation loss)
        "seconds": run.seconds,
        "diagnostics": [_slim(row) for row in recorder.rows],
    }


def _slim(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("step", "final_shared", "units", "update_ratio", "grad_norm", "kind")
    return {key: row[key] for key in keep if key in row}


def load_payload(path: Path) -> dict[str, Any]:
    """A grid's JSON, old or new: a shape without D / d read as D = 2d."""
    payload = json.loads(path.read_text())
    payload.setdefault("runs", [])
    shape = payload.get("settings", {}).get("shape")
    if shape is not None:
        payload["settings"]["shape"] = {**json.loads(json.dumps(asdict(Shape()))), **shape}
    return payload


# ---------------------------------------------------------------------------------------------------- checks
def acceptance(runs: list[dict[str, Any]], arch: str = "hires", baseline: str = CONTROL) -> list[tuple[str, bool, str]]:
    """The three stability checks of `arch` against `baseline`, each with its verdict and the numbers behind it.

    1. no run of `arch` on the plateau at a rate where the baseline learns (fails when the baseline learns at no
       rate: then the grid says nothing);
    2. `arch` at the baseline's best rate within 0.05 nats of it, or better;
    3. `arch`'s best below the baseline's best, each over its own rates (with the edge a best sits at, if any).
    """
    who = "the control" if baseline == CONTROL else "the plain twin" if baseline == PLAIN else f"`{baseline}`"
    loss = {(r["arch"], r["lr"]): r["final_loss"] for r in runs if r["arch"] in (arch, baseline)}
    plateau = {(r["arch"], r["lr"]): r["plateau"] for r in runs if r["arch"] in (arch, baseline)}
    base_rates = sorted(lr for a, lr in loss if a == baseline)
    own_rates = sorted(lr for a, lr in loss if a == arch)
    names = (
        f"no HiRes run on the plateau where {who} learns",
        f"HiRes at {who}'s best rate within 0.05 of it or better",
        f"HiRes's best below {who}'s best (each over its own rates)",
    )
    if not base_rates or not own_rates:
        missing = "HiRes" if not own_rates else who
        return [(name, False, f"{missing} did not run") for name in names]
    learns = [lr for lr in base_rates if not plateau[(baseline, lr)]]
    stuck = [lr for lr in learns if plateau.get((arch, lr), True)]
    best_b = min(base_rates, key=lambda lr: loss[(baseline, lr)])
    best_h = min(own_rates, key=lambda lr: loss[(arch, lr)])
    if learns:
        first = (not stuck, f"{who} learns at {_rates(learns)}; HiRes on the plateau at {_rates(stuck) or 'none'}")
    else:
        first = (False, f"no rate learns: {who} is on the plateau at every rate ({_rates(base_rates)})")
    base_best, at_best = loss[(baseline, best_b)], loss.get((arch, best_b))
    if at_best is None:
        second = (False, f"HiRes did not run at {best_b:g}, {who}'s best rate")
    else:
        gap = at_best - base_best
        second = (gap <= 0.05, f"at {best_b:g}: HiRes {at_best:.3f} vs {who} {base_best:.3f} ({gap:+.3f})")
    edges = [f"{name}'s best: {status}" for name, status in _edges(loss, {"HiRes": arch, who: baseline}).items()]
    third = (
        loss[(arch, best_h)] < base_best,
        f"HiRes {loss[(arch, best_h)]:.3f} at {best_h:g} vs {who} {base_best:.3f} at {best_b:g}"
        + "".join(f"; {edge}" for edge in edges),
    )
    return [(name, *verdict) for name, verdict in zip(names, (first, second, third))]


def _edges(loss: dict[tuple[str, float], float], arms: dict[str, str]) -> dict[str, str]:
    """Which of `arms` (label -> arch) has its best rate at an edge of its grid (the best is then a bound)."""
    statuses = {
        label: bracket_status({lr: value for (name, lr), value in loss.items() if name == arch})
        for label, arch in arms.items()
    }
    return {label: status for label, status in statuses.items() if status != "bracketed"}


def _rates(rates: list[float]) -> str:
    return ", ".join(f"{lr:g}" for lr in rates)


# ---------------------------------------------------------------------------------------------------- report
def markdown(payload: dict[str, Any], checked: str = "hires") -> str:
    """The section: settings, the loss table (archs in order of appearance), the checks of `checked`."""
    runs, settings = payload["runs"], payload["settings"]
    present = list(dict.fromkeys(r["arch"] for r in runs))
    archs = [a for a in VARIANTS if a in present] + [a for a in present if a not in VARIANTS]
    rates = sorted({r["lr"] for r in runs})
    loss = {(r["arch"], r["lr"]): r for r in runs}
    shape = settings["shape"]
    blocks = shape["num_hidden_layers"] // shape["layers_per_block"]
    ratio = shape.get("residual_ratio", 2.0)  # files written before the harness: D = 2d
    lines = [
        f"## Stability: {payload['title']}",
        "",
        f"`{payload['command']}` ({payload['device']}, {payload['minutes']:.1f} min). Shape d={shape['hidden_size']}, "
        f"L={shape['num_hidden_layers']}, k={shape['layers_per_block']} ({blocks} blocks), D={ratio:g}d, "
        f"heads of {shape['head_dim']}, vocab {shape['vocab_size']}; batches of "
        f"{settings['batch_size']} x {settings['block_size']} tokens, {settings['vanilla_steps']} vanilla steps "
        "(HiRes: fewer, at equal counted FLOPs). The control is the baseline: the Llama twin with HiRes's "
        "embedding scale; the plain twin is Llama as it ships. Final validation loss; * = at or above the unigram "
        "plateau "
        f"(within {PLATEAU_MARGIN} nats of the unigram cross-entropy {payload['unigram_loss']:.3f}).",
        "",
        *markdown_table(
            ["peak lr", *(LABELS.get(a, a) for a in archs)],
            [[f"{lr:g}", *(_loss_cell(loss.get((arch, lr))) for arch in archs)] for lr in rates],
            align="r" * (len(archs) + 1),
        ),
    ]
    lines += checks_lines(runs, checked)
    lines += ["", f"![validation loss against steps]({payload['figure']})", ""]  # next to this file
    return "\n".join(lines)


def _loss_cell(run: dict[str, Any] | None) -> str:
    """A table cell: the final loss, starred on the plateau; empty where the cell did not run."""
    return "" if run is None else f"{run['final_loss']:.3f}{'*' if run['plateau'] else ''}"


def checks_lines(runs: list[dict[str, Any]], checked: str = "hires", on: str = "") -> list[str]:
    """The checks of `checked` as markdown tables: against the control (the baseline), then the plain twin."""
    archs = {r["arch"] for r in runs}
    against = {CONTROL: "the control (the baseline: Llama with HiRes's embedding scale)", PLAIN: "the plain twin"}
    lines: list[str] = []
    for baseline in (b for b in BASELINES if {b, checked} <= archs):
        lines += ["", f"Checks of `{checked}` against {against[baseline]}{on}:", ""]
        verdicts = [
            (name, "pass" if ok else "FAIL", numbers) for name, ok, numbers in acceptance(runs, checked, baseline)
        ]
        lines += markdown_table(["check", "verdict", "numbers"], verdicts)
    return lines


def plot(payload: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    runs = payload["runs"]
    rates = sorted({r["lr"] for r in runs})
    fig, axes = plt.subplots(1, len(rates), figsize=(4.2 * len(rates), 3.8), sharey=True, squeeze=False)
    archs = list(dict.fromkeys(r["arch"] for r in runs))
    palette = ("tab:blue", "tab:red", "tab:gray", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink")
    colours = dict(zip(archs, palette * 2))  # a colour for each architecture that ran
    for ax, lr in zip(axes[0], rates):
        for run in (r for r in runs if r["lr"] == lr):
            steps, losses = zip(*run["curve"])
            label = LABELS.get(run["arch"], run["arch"])
            ax.plot(steps, losses, marker="o", ms=3, color=colours[run["arch"]], label=label)
        ax.axhline(payload["unigram_loss"], color="k", ls=":", lw=1, label="unigram")
        ax.set_title(f"peak lr {lr:g}")
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("validation loss (nats/token)")
    handles = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8)
    fig.suptitle(payload["title"])
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------- map
def map_points() -> list[tuple[str, StabilitySettings]]:
    """Where does the old default stall? One factor at a time around the CPU shape, at peak lr 3e-3."""
    base = replace(StabilitySettings(), learning_rates=(3e-3,), vanilla_steps=80)
    shape = base.shape
    return [
        ("d=64, 4 blocks", replace(base, shape=replace(shape, hidden_size=64))),
        ("d=128, 4 blocks", base),
        ("d=128, 1 block (L=4)", replace(base, shape=replace(shape, num_hidden_layers=4))),
        ("d=128, 2 blocks (L=8)", replace(base, shape=replace(shape, num_hidden_layers=8))),
        ("d=128, batch 4 x 128", replace(base, batch_size=4)),
        ("d=128, batch 64 x 128", replace(base, batch_size=64, vanilla_steps=40)),
        ("d=128, bf16 autocast", replace(base, precision="bf16")),
    ]


MAP_ARCHS = (CONTROL, PLAIN, "hires-old-default")


def run_map(out_dir: Path, command: str) -> dict[str, Any]:
    """Each map point: the twin and the old default at lr 3e-3 (the new default's range is the grid's); JSON
    after every run."""
    started = time.perf_counter()
    device = pick_device("cpu")
    rows: list[dict[str, Any]] = []
    payload = {"command": command, "rows": rows}
    cache: dict[tuple[int, int], Data] = {}
    for label, settings in tqdm(map_points(), desc="map", unit="point"):
        key = (settings.shape.vocab_size, settings.block_size)
        if key not in cache:
            cache[key] = prepare(settings)
        data = cache[key]
        for arch in MAP_ARCHS:
            run = run_one(arch, settings.learning_rates[0], settings, data, device)
            final_shared = run["diagnostics"][-1]["final_shared"] if run["diagnostics"] else None
            rows.append({"point": label, "unigram_loss": data.unigram_loss, "final_shared": final_shared, **run})
            payload["minutes"] = (time.perf_counter() - started) / 60
            write_json_atomic(out_dir / "stability_map.json", payload)
    write_text_atomic(out_dir / "stability_map.md", map_markdown(payload))
    map_plot(payload, out_dir / "stability_map.png")
    return payload


def map_plot(payload: dict[str, Any], path: Path) -> Path:
    """Bars: the final loss of the baselines and of the old default at each map point, the unigram loss as a tick."""
    plt = pyplot()
    all_rows = payload["rows"]
    points = list(dict.fromkeys(row["point"] for row in all_rows))
    archs = [arch for arch in MAP_ARCHS if any(row["arch"] == arch for row in all_rows)]
    fig, ax = plt.subplots(figsize=(1.6 * len(points) + 2, 4))
    width = 0.8 / len(archs)
    for i, arch in enumerate(archs):
        rows = {row["point"]: row for row in all_rows if row["arch"] == arch}
        xs = [p + i * width for p in range(len(points))]
        ax.bar(xs, [rows[p]["final_loss"] if p in rows else 0 for p in points], width, label=LABELS.get(arch, arch))
    for p, point in enumerate(points):
        unigram = next(row["unigram_loss"] for row in all_rows if row["point"] == point)
        ax.hlines(unigram, p - width / 2, p + width * (len(archs) - 0.5), colors="k", linestyles=":")
    ax.set_xticks([p + width / 2 for p in range(len(points))], points, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("final validation loss (dotted: unigram)")
    low = min(row["final_loss"] for row in all_rows)
    ax.set_ylim(low - 0.5, max(row["unigram_loss"] for row in all_rows) + 0.3)
    ax.legend(fontsize=8)
    ax.set_title("Where the old default stalls (peak lr 3e-3)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def map_markdown(payload: dict[str, Any]) -> str:
    all_rows = payload["rows"]
    archs = [arch for arch in MAP_ARCHS if any(row["arch"] == arch for row in all_rows)]  # the ones that ran
    lines = [
        "## Where the old default stalls (peak lr 3e-3, one factor at a time)",
        "",
        f"`{payload['command']}` (CPU, {payload['minutes']:.1f} min). Final validation loss (* = on the unigram "
        "plateau) and, in brackets, the shared fraction of the last hidden state (1 = every token the same).",
        "",
        *markdown_table(["point", "unigram", *(LABELS.get(a, a) for a in archs)], align="lr" + "r" * len(archs)),
    ]
    points = list(dict.fromkeys(row["point"] for row in all_rows))
    for point in points:
        rows = {row["arch"]: row for row in all_rows if row["point"] == point}
        cells = [
            f"{rows[a]['final_loss']:.3f}{'*' if rows[a]['plateau'] else ''} ({rows[a]['final_shared']:.2f})"
            if a in rows
            else ""
            for a in archs
        ]
        unigram = next(iter(rows.values()))["unigram_loss"]
        lines.append(markdown_row([point, f"{unigram:.3f}", *cells]))
    lines += ["", "![map](stability_map.png)"]
    return "\n".join(lines) + "\n"


def diagnostics_figures(payload: dict[str, Any], out_dir: Path, name: str) -> list[Path]:
    """`hires-hf inspect`'s run figure for each HiRes variant at the highest rate the old default ran at (or the
    grid's middle rate): the stream's shared fraction, write/stream ratio, update ratios, gradient norms."""
    from hires_hf.diagnostics.plot import plot_run

    old = sorted(r["lr"] for r in payload["runs"] if r["arch"] == "hires-old-default")
    rates = sorted({r["lr"] for r in payload["runs"]})
    lr = old[-1] if old else rates[len(rates) // 2]
    paths = []
    for run in payload["runs"]:
        if run["lr"] == lr and run["arch"].startswith("hires") and run["diagnostics"]:
            path = out_dir / f"{name}_diagnostics_{run['arch']}.png"
            paths.append(plot_run(run["diagnostics"], path, title=f"{run['arch']} at peak lr {lr:g}"))
    return paths


# ---------------------------------------------------------------------------------------------------- main
def grid_jobs(settings: StabilitySettings) -> list[tuple[float, str]]:
    if settings.cells:
        return list(settings.cells)
    return [
        (lr, arch)
        for lr in settings.learning_rates
        for arch in settings.archs
        if arch != "hires-old-default" or settings.old_lrs is None or lr in settings.old_lrs
    ]


# Settings that may differ between a grid and its extension (which cells run), not what a run is.
GRID_FIELDS = ("learning_rates", "archs", "old_lrs", "cells")


def extended(path: Path, settings: StabilitySettings) -> dict[str, Any]:
    """The finished payload at `path`, checked to be the same experiment as `settings`, to add cells to."""
    if not path.is_file():
        raise SystemExit(f"error: --extend found no grid at {path}; run it once without --extend")
    payload = load_payload(path)
    new = {k: v for k, v in json.loads(json.dumps(asdict(settings))).items() if k not in GRID_FIELDS}
    old = {k: v for k, v in payload["settings"].items() if k not in GRID_FIELDS}
    differ = sorted(k for k in new.keys() | old.keys() if new.get(k) != old.get(k))
    if differ:
        raise SystemExit(f"error: --extend: {path.name} differs in {', '.join(differ)}; pass the same preset options")
    return payload


def run(
    settings: StabilitySettings, out_dir: Path, name: str, title: str, command: str, extend: bool = False
) -> dict[str, Any]:
    """Every (learning rate, architecture) run; the JSON is rewritten after each, so a cut-off run keeps its rows.
    With `extend`, the grid already at `name` keeps its runs and only its missing cells run."""
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    previous = extended(out_dir / f"{name}.json", settings) if extend else None
    device = pick_device(settings.device)
    data = prepare(settings)
    payload: dict[str, Any] = previous or {
        "title": title,
        "command": command,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "settings": asdict(settings),
        "unigram_loss": data.unigram_loss,
        "figure": f"{name}.png",
        "runs": [],
    }
    if previous:
        payload["command"] = f"{previous['command']}; {command}"
        done = {(run["lr"], run["arch"]) for run in previous["runs"]}
        jobs = [job for job in grid_jobs(settings) if job not in done]
        spent = previous.get("minutes", 0.0)
        rates = {*payload["settings"]["learning_rates"], *settings.learning_rates}
        payload["settings"]["learning_rates"] = sorted(rates)
    else:
        jobs, spent = grid_jobs(settings), 0.0
    for lr, arch in tqdm(jobs, desc="stability", unit="run"):
        payload["runs"].append(run_one(arch, lr, settings, data, device))
        payload["minutes"] = spent + (time.perf_counter() - started) / 60
        write_json_atomic(out_dir / f"{name}.json", payload)
    plot(payload, out_dir / f"{name}.png")
    diagnostics_figures(payload, out_dir, name)
    write_text_atomic(out_dir / f"{name}.md", markdown(payload))
    return payload


# ---------------------------------------------------------------------------------------------------- over seeds
def load_seeds(paths: list[Path]) -> list[dict[str, Any]]:
    """The grids' payloads, checked to be one experiment: same unigram loss (same data) and shape."""
    payloads = [load_payload(path) for path in paths]
    shapes = {json.dumps(p["settings"]["shape"], sort_keys=True) for p in payloads}
    if len(shapes) > 1 or len({round(p["unigram_loss"], 9) for p in payloads}) > 1:
        raise SystemExit("error: these grids differ in shape or data; pass grids of one preset run under other seeds")
    return payloads


def seed_cells(payloads: list[dict[str, Any]]) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """(arch, lr) -> that cell's run in each grid that has it."""
    cells: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for payload in payloads:
        for run in payload["runs"]:
            cells.setdefault((run["arch"], run["lr"]), []).append(run)
    return cells


def seed_means(cells: dict[tuple[str, float], list[dict[str, Any]]], seeds: int) -> list[dict[str, Any]]:
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


def seeds_markdown(payloads: list[dict[str, Any]], paths: list[Path], figure: str) -> str:
    seeds = [p["settings"]["seed"] for p in payloads]
    cells = seed_cells(payloads)
    archs = [a for a in VARIANTS if any(arch == a for arch, _ in cells)]
    shape = payloads[0]["settings"]["shape"]
    lines = [
        "## Stability over seeds",
        "",
        f"`python benchmarks/stability.py --over-seeds {' '.join(p.name for p in paths)}`: seeds {seeds}, "
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
    lines += checks_lines(
        seed_means(cells, len(payloads)), on=" on the means (a rate is on the plateau if any seed is)"
    )
    return "\n".join([*lines, "", f"![final loss against learning rate over seeds]({figure})", ""])


def seeds_plot(payloads: list[dict[str, Any]], path: Path) -> Path:
    plt = pyplot()
    cells = seed_cells(payloads)
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


def over_seeds(grids: list[Path], name: str) -> str:
    """`--over-seeds`: the grids side by side, written as NAME.md and NAME.png next to the first grid."""
    missing = [str(path) for path in grids if not path.is_file()]
    if missing:
        raise SystemExit(f"error: no grid at {', '.join(missing)}; run `python benchmarks/stability.py --seed N` first")
    payloads = load_seeds(grids)
    out_dir = grids[0].parent
    seeds_plot(payloads, out_dir / f"{name}.png")
    text = seeds_markdown(payloads, grids, f"{name}.png")
    write_text_atomic(out_dir / f"{name}.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=("cpu", "d192", "gpu"), default="cpu")
    parser.add_argument("--smoke", action="store_true", help="seconds-long run (tests)")
    parser.add_argument("--map", action="store_true", help="where the old default stalls (see module docstring)")
    parser.add_argument("--lrs", type=float, nargs="+", help="peak learning rates (default: the preset's grid)")
    parser.add_argument("--vanilla-steps", type=int, help="steps of the vanilla twins (HiRes: equal FLOPs)")
    parser.add_argument(
        "--archs",
        nargs="+",
        choices=VARIANTS,
        help=f"architectures (default: {' '.join(ARCHS)})",
    )
    parser.add_argument("--ablation", action="store_true", help="each part of the fix alone (ABLATION_CELLS)")
    parser.add_argument("--old-lrs", type=float, nargs="+", help="run hires-old-default at these rates only")
    parser.add_argument("--width", type=int, help="hidden size d of the preset's shape (D = 2d, heads of 64)")
    parser.add_argument("--extend", action="store_true", help="add the missing cells to the grid already written")
    parser.add_argument("--seed", type=int, default=0, help="initialisation and batch order (default 0)")
    parser.add_argument("--name", help="file name of the outputs (default: stability or stability_gpu)")
    parser.add_argument("--render", type=Path, help="rewrite the table and figure of a finished (or cut-off) JSON")
    parser.add_argument(
        "--over-seeds",
        nargs="*",
        type=Path,
        metavar="GRID",
        help="grids of one shape under other seeds, side by side (default: stability.json, stability_seed1.json)",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.render:
        payload = load_payload(args.render)
        plot(payload, args.render.with_suffix(".png"))
        diagnostics_figures(payload, args.render.parent, args.render.stem)
        write_text_atomic(args.render.with_suffix(".md"), markdown(payload))
        print(markdown(payload))
        return 0
    if args.over_seeds is not None:
        grids = args.over_seeds or [args.out_dir / "stability.json", args.out_dir / "stability_seed1.json"]
        print(over_seeds(grids, args.name or "stability_seeds"))
        return 0
    command = "python benchmarks/stability.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.map:
        print(map_markdown(run_map(args.out_dir, command.strip())))
        return 0
    presets = {"cpu": StabilitySettings, "d192": StabilitySettings.d192, "gpu": StabilitySettings.gpu}
    settings = replace(StabilitySettings.smoke() if args.smoke else presets[args.preset](), seed=args.seed)
    if args.width:
        settings = replace(settings, shape=replace(settings.shape, hidden_size=args.width))
    if args.lrs:
        settings = replace(settings, learning_rates=tuple(args.lrs))
    if args.vanilla_steps:
        settings = replace(settings, vanilla_steps=args.vanilla_steps)
    if args.archs:
        settings = replace(settings, archs=tuple(args.archs))
    if args.old_lrs:
        settings = replace(settings, old_lrs=tuple(args.old_lrs))
    name = args.name or ("stability" if args.preset == "cpu" else f"stability_{args.preset}")
    name += "" if args.name else f"_d{args.width}" * bool(args.width) + f"_seed{args.seed}" * bool(args.seed)
    shape_name = {"cpu": "CPU shape", "d192": "the d=192 CPU reproduction", "gpu": "GPU shape"}[args.preset]
    shape_name += f" at d={args.width}" if args.width else ""
    title = f"HiRes vs the control over a learning-rate grid ({shape_name}, seed {args.seed})"
    if args.ablation:
        settings = replace(settings, cells=ABLATION_CELLS)
        name, title = args.name or "stability_ablation", "Each part of the fix alone (CPU shape)"
    payload = run(settings, args.out_dir, name, title, command.strip(), extend=args.extend)
    print(markdown(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
