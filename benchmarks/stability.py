"""Stability: does HiRes leave the unigram plateau at every learning rate where its vanilla twin learns?

Each architecture trains over a grid of peak learning rates at matched counted training FLOPs (HiRes pays for
its projections with fewer steps), on the same batches, with the package's recipe (`hires_hf.training.loop`:
AdamW 0.9 / 0.95, weight decay 0.1, warmup 5%, cosine to 10%, clip 1.0, one learning rate for every
parameter, as a user's `AdamW(model.parameters())` would). Three architectures:

- `vanilla`: the transformers twin (Llama) of the HiRes shape;
- `hires`: HiRes with the package's defaults;
- `hires-old-default`: HiRes as it shipped before the fix (`embedding_multiplier=1.0`, `write_norm=False`,
  `write_multiplier=1.0`: tokens enter the wide stream ~50x below the RMS the outer norms hold it at, the write
  reads the raw inner stream, and its Adam steps grow with the width); `--ablation` adds the fix's parts alone,
  and `vanilla-scaled-embedding` is a control: the twin with HiRes's embedding scale (is the lead only that?).

A run is "on the plateau" when its final validation loss is within 0.2 nats of the unigram cross-entropy of
the validation data (what a model that ignores its input reaches). Writes a table, the acceptance checks
(HiRes learns wherever its twin does, and at least as well) and a PNG of validation loss against steps per
learning rate.

    python benchmarks/stability.py                 # CPU: d=128, L=16, k=4 (4 blocks); ~15 minutes on 2 cores
    python benchmarks/stability.py --preset issue  # the d=192 CPU reproduction of the stall: 32 x 128 batches; ~50 min
    python benchmarks/stability.py --seed 1        # the CPU grid again with other weights and batches
    python benchmarks/stability.py --width 64      # the CPU grid at another width (write multiplier 128/d)
    python benchmarks/stability.py --extend --lrs 8e-3   # add cells to a grid already written (same options)
    python benchmarks/stability.py --preset gpu    # one GPU: d=512, L=16, 12M vanilla tokens a run; ~8 min on an H200
    python benchmarks/stability.py --map           # where the old default stalls: width, blocks, batch, dtype
    python benchmarks/stability.py --ablation      # each part of the fix alone, up to lr 1.6e-2
    python benchmarks/stability.py --smoke         # seconds: tests

Writes benchmarks/results/stability[_issue|_gpu|_map][_dD][_seedN].{md,json,png} (or under --out-dir).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM

from hires_hf import HiResConfig
from hires_hf.accounting import train_flops_per_token
from hires_hf.diagnostics import DiagnosticsRecorder
from hires_hf.io import write_json_atomic, write_text_atomic
from hires_hf.training import (
    build_tokenizer,
    encode_documents,
    load_default_corpus,
    load_python_sources,
    pack,
    special_token_ids,
)
from hires_hf.training.loop import LoopSettings, pick_device, train_loop
from hires_hf.twins import scale_twin_embedding, vanilla_config

RESULTS = Path(__file__).resolve().parent / "results"
# HiRes variants by the config fields that differ from the defaults (None: the vanilla twin).
VARIANTS: dict[str, dict[str, Any] | None] = {
    "vanilla": None,
    "hires": {},
    "hires-old-default": {"embedding_multiplier": 1.0, "write_norm": False, "write_multiplier": 1.0},
    "hires-embedding-fix-only": {"write_norm": False, "write_multiplier": 1.0},
    "hires-no-write-multiplier": {"write_multiplier": 1.0},
    "hires-write-multiplier-1/4": {"write_multiplier": 0.25},
    "vanilla-scaled-embedding": None,  # a control: the twin with its embedding output x 1/initializer_range
}
# Twins whose token embedding output is multiplied by 1/initializer_range in the forward, as HiRes's default
# does: is HiRes's lead the architecture, or only the embedding scale the twin could adopt too?
SCALED_EMBEDDING_TWINS = ("vanilla-scaled-embedding",)
ARCHS = ("vanilla", "hires", "hires-old-default")
# The ablation at the CPU shape (d=128, where the default write multiplier is 1): the embedding fix alone at the
# grid's rate and at 1e-2 (where the write norm is needed), and at 1.6e-2 the write multiplier of d=512
# (128/512 = 1/4): lr * d * multiplier is the same as at d=512 and lr 4e-3, the GPU stall the multiplier removes.
ABLATION_CELLS = (
    (3e-3, "hires-embedding-fix-only"),
    (3e-3, "hires-write-multiplier-1/4"),
    (1e-2, "vanilla"),
    (1e-2, "hires-embedding-fix-only"),
    (1e-2, "hires"),
    (1.6e-2, "vanilla"),
    (1.6e-2, "hires"),
    (1.6e-2, "hires-write-multiplier-1/4"),
)
PLATEAU_MARGIN = 0.2  # nats below the unigram cross-entropy a run must reach to count as learning


@dataclass(frozen=True)
class Shape:
    """The HiRes shape under test (its twin has the same layers)."""

    hidden_size: int = 128
    num_hidden_layers: int = 16
    layers_per_block: int = 4
    head_dim: int = 64
    intermediate_size: int | None = None  # None: ~8d/3, a multiple of 8
    vocab_size: int = 4096

    def config(self, special: dict[str, int | None], block_size: int, **fields: Any) -> HiResConfig:
        d = self.hidden_size
        return HiResConfig(
            vocab_size=self.vocab_size,
            hidden_size=d,
            intermediate_size=self.intermediate_size or math.ceil(8 * d / 3 / 8) * 8,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=max(1, d // self.head_dim),
            head_dim=self.head_dim if d >= self.head_dim else d,
            max_position_embeddings=2 * block_size,
            residual_size=2 * d,
            layers_per_block=self.layers_per_block,
            **special,
            **fields,
        )


@dataclass(frozen=True)
class StabilitySettings:
    shape: Shape = Shape()
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
    def issue(cls) -> StabilitySettings:
        """The CPU reproduction of the stall: d=192, L=16, 3 heads x 64, vocab 4096, batches of 32 x 128, 0.6M vanilla
        tokens a run (146 steps), Python sources; the old default only at 3e-3, where it stalled first."""
        return cls(
            shape=Shape(hidden_size=192),
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


@dataclass
class Data:
    train: torch.Tensor
    validation: torch.Tensor
    special: dict[str, int | None]
    unigram_loss: float


def prepare(settings: StabilitySettings) -> Data:
    """One corpus, one tokenizer, packed blocks, and the unigram cross-entropy of the validation blocks."""
    loader = load_python_sources if settings.corpus == "python" else load_default_corpus
    corpus = loader(validation_fraction=settings.validation_fraction, max_chars=settings.max_chars)
    tokenizer = build_tokenizer(corpus.train, vocab_size=settings.shape.vocab_size, sample_chars=2_000_000)
    eos = tokenizer.eos_token_id
    train = pack(encode_documents(tokenizer, corpus.train), settings.block_size, eos)
    validation = pack(encode_documents(tokenizer, corpus.validation), settings.block_size, eos)
    validation = validation[: settings.eval_blocks]
    return Data(train, validation, special_token_ids(tokenizer), unigram_loss(train, validation))


def unigram_loss(train: torch.Tensor, validation: torch.Tensor) -> float:
    """Cross-entropy (nats/token) of the validation tokens under the training tokens' unigram distribution
    (add-one smoothed): the loss of a model that predicts the same distribution whatever its input."""
    counts = Counter(train.flatten().tolist())
    vocab = max(int(train.max()), int(validation.max())) + 1
    total = sum(counts.values()) + vocab
    targets = validation[:, 1:].flatten().tolist()  # the model is scored from the second token on
    return -sum(math.log((counts.get(t, 0) + 1) / total) for t in targets) / len(targets)


def arch_config(arch: str, settings: StabilitySettings, data: Data):
    fields = VARIANTS[arch]
    hires = settings.shape.config(data.special, settings.block_size, **(fields or {}))
    return vanilla_config(hires) if fields is None else hires


def run_one(arch: str, lr: float, settings: StabilitySettings, data: Data, device: torch.device) -> dict[str, Any]:
    """One architecture at one peak rate, at the vanilla twin's counted FLOPs; diagnostics every few steps."""
    config = arch_config(arch, settings, data)
    twin_flops = train_flops_per_token(arch_config("vanilla", settings, data), settings.block_size)
    flops = train_flops_per_token(config, settings.block_size)
    steps = max(1, int(settings.vanilla_steps * twin_flops / flops))
    torch.manual_seed(settings.seed)
    model = AutoModelForCausalLM.from_config(config).to(device)
    if arch in SCALED_EMBEDDING_TWINS:
        scale_twin_embedding(model, 1 / config.initializer_range)
    loop = LoopSettings(
        steps=steps,
        batch_size=settings.batch_size,
        learning_rate=lr,
        evaluations=settings.evaluations,
        seed=settings.seed,
        precision=settings.precision,
    )
    probe = data.validation[:8].to(device)
    recorder = DiagnosticsRecorder(probe, every=settings.diagnostics_every, entropy=False)
    hooks = {"before_update": recorder.before_step, "after_update": recorder.after_step}
    result = train_loop(model, data.train, data.validation, loop, **hooks)
    tokens_per_step = settings.batch_size * settings.block_size
    return {
        "arch": arch,
        "lr": lr,
        "steps": result.steps,
        "flops": result.steps * tokens_per_step * flops,
        "final_loss": result.final_loss,
        "plateau": not result.final_loss < data.unigram_loss - PLATEAU_MARGIN,
        "curve": result.curve,
        "train_losses": result.train_losses[:: max(1, result.steps // 100)],
        "seconds": result.train_seconds,
        "diagnostics": [_slim(row) for row in recorder.rows],
    }


def _slim(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("step", "final_shared", "units", "update_ratio", "grad_norm", "kind")
    return {key: row[key] for key in keep if key in row}


# ---------------------------------------------------------------------------------------------------- checks
def acceptance(runs: list[dict[str, Any]], arch: str = "hires", twin: str = "vanilla") -> list[tuple[str, bool, str]]:
    """The three stability checks of `arch` against `twin`, each with its verdict and the numbers behind it (the
    twin's best rate among those both ran)."""
    renamed = {arch: "hires", twin: "vanilla"}
    runs = [{**r, "arch": renamed[r["arch"]]} for r in runs if r["arch"] in renamed]
    loss = {(r["arch"], r["lr"]): r["final_loss"] for r in runs}
    plateau = {(r["arch"], r["lr"]): r["plateau"] for r in runs}
    twin_rates = sorted(r["lr"] for r in runs if r["arch"] == "vanilla")
    learns = [lr for lr in twin_rates if not plateau[("vanilla", lr)]]
    stuck = [lr for lr in learns if plateau.get(("hires", lr), True)]
    rates = [lr for lr in twin_rates if ("hires", lr) in loss]
    best_v = min(rates, key=lambda lr: loss[("vanilla", lr)])
    best_h = min((lr for a, lr in loss if a == "hires"), key=lambda lr: loss[("hires", lr)])
    gap = loss[("hires", best_v)] - loss[("vanilla", best_v)]
    return [
        (
            "no HiRes run on the plateau where the twin learns",
            not stuck,
            f"twin learns at {_rates(learns)}; HiRes on the plateau at {_rates(stuck) or 'none of them'}",
        ),
        (
            "HiRes at the twin's best rate within 0.05 of the twin or better",
            gap <= 0.05,
            f"at {best_v:g}: HiRes {loss[('hires', best_v)]:.3f} vs twin {loss[('vanilla', best_v)]:.3f} ({gap:+.3f})",
        ),
        (
            "HiRes's best over the grid below the twin's best",
            loss[("hires", best_h)] < loss[("vanilla", best_v)],
            f"HiRes {loss[('hires', best_h)]:.3f} at {best_h:g} vs twin {loss[('vanilla', best_v)]:.3f} at {best_v:g}",
        ),
    ]


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
    lines = [
        f"## Stability: {payload['title']}",
        "",
        f"`{payload['command']}` ({payload['device']}, {payload['minutes']:.1f} min). Shape d={shape['hidden_size']}, "
        f"L={shape['num_hidden_layers']}, k={shape['layers_per_block']} ({blocks} blocks), D=2d, "
        f"heads of {shape['head_dim']}, vocab {shape['vocab_size']}; batches of "
        f"{settings['batch_size']} x {settings['block_size']} tokens, {settings['vanilla_steps']} vanilla steps "
        "(HiRes: fewer, at equal counted FLOPs). Final validation loss; * = at or above the unigram plateau "
        f"(within {PLATEAU_MARGIN} nats of the unigram cross-entropy {payload['unigram_loss']:.3f}).",
        "",
        "| peak lr | " + " | ".join(archs) + " |",
        "|---:|" + "---:|" * len(archs),
    ]
    for lr in rates:
        cells = []
        for arch in archs:
            run = loss.get((arch, lr))
            cells.append("" if run is None else f"{run['final_loss']:.3f}{'*' if run['plateau'] else ''}")
        lines.append(f"| {lr:g} | " + " | ".join(cells) + " |")
    lines += checks_lines(runs, checked)
    lines += ["", f"![validation loss against steps](results/{payload['figure']})", ""]  # from RESULTS.md
    return "\n".join(lines)


def checks_lines(runs: list[dict[str, Any]], checked: str = "hires", on: str = "") -> list[str]:
    """The checks of `checked` as markdown tables: against the twin, then against each control that ran."""
    archs = {r["arch"] for r in runs}
    lines: list[str] = []
    for twin in (t for t in ("vanilla", *SCALED_EMBEDDING_TWINS) if {t, checked} <= archs):
        against = "the twin" if twin == "vanilla" else f"the control `{twin}` (the twin with HiRes's embedding scale)"
        lines += ["", f"Checks of `{checked}` against {against}{on}:", ""]
        lines += ["| check | verdict | numbers |", "|---|---|---|"]
        for name, ok, numbers in acceptance(runs, checked, twin=twin):
            name = name if twin == "vanilla" else name.replace("the twin", "the control")
            lines.append(f"| {name} | {'pass' if ok else 'FAIL'} | {numbers} |")
    return lines


def plot(payload: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = payload["runs"]
    rates = sorted({r["lr"] for r in runs})
    fig, axes = plt.subplots(1, len(rates), figsize=(4.2 * len(rates), 3.8), sharey=True, squeeze=False)
    archs = list(dict.fromkeys(r["arch"] for r in runs))
    palette = ("tab:blue", "tab:red", "tab:gray", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink")
    colours = dict(zip(archs, palette))  # one colour for each of the VARIANTS
    for ax, lr in zip(axes[0], rates):
        for run in (r for r in runs if r["lr"] == lr):
            steps, losses = zip(*run["curve"])
            ax.plot(steps, losses, marker="o", ms=3, color=colours[run["arch"]], label=run["arch"])
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


MAP_ARCHS = ("vanilla", "hires-old-default")


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
        data = cache.setdefault(key, prepare(settings))
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
    """Bars: the final loss of the twin and of the old default at each map point, the unigram loss as a tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = list(dict.fromkeys(row["point"] for row in payload["rows"]))
    fig, ax = plt.subplots(figsize=(1.6 * len(points) + 2, 4))
    width = 0.8 / len(MAP_ARCHS)
    for i, arch in enumerate(MAP_ARCHS):
        rows = {row["point"]: row for row in payload["rows"] if row["arch"] == arch}
        xs = [p + i * width for p in range(len(points))]
        ax.bar(xs, [rows[p]["final_loss"] if p in rows else 0 for p in points], width, label=arch)
    for p, point in enumerate(points):
        unigram = next(row["unigram_loss"] for row in payload["rows"] if row["point"] == point)
        ax.hlines(unigram, p - width / 2, p + width * (len(MAP_ARCHS) - 0.5), colors="k", linestyles=":")
    ax.set_xticks([p + width / 2 for p in range(len(points))], points, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("final validation loss (dotted: unigram)")
    low = min(row["final_loss"] for row in payload["rows"])
    ax.set_ylim(low - 0.5, max(row["unigram_loss"] for row in payload["rows"]) + 0.3)
    ax.legend(fontsize=8)
    ax.set_title("Where the old default stalls (peak lr 3e-3)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def map_markdown(payload: dict[str, Any]) -> str:
    lines = [
        "## Where the old default stalls (peak lr 3e-3, one factor at a time)",
        "",
        f"`{payload['command']}` (CPU, {payload['minutes']:.1f} min). Final validation loss (* = on the unigram "
        "plateau) and, in brackets, the shared fraction of the last hidden state (1 = every token the same).",
        "",
        "| point | unigram | " + " | ".join(MAP_ARCHS) + " |",
        "|---|---:|" + "---:|" * len(MAP_ARCHS),
    ]
    points = list(dict.fromkeys(row["point"] for row in payload["rows"]))
    for point in points:
        rows = {row["arch"]: row for row in payload["rows"] if row["point"] == point}
        cells = [
            f"{rows[a]['final_loss']:.3f}{'*' if rows[a]['plateau'] else ''} ({rows[a]['final_shared']:.2f})"
            if a in rows
            else ""
            for a in MAP_ARCHS
        ]
        unigram = next(iter(rows.values()))["unigram_loss"]
        lines.append(f"| {point} | {unigram:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "![map](results/stability_map.png)"]
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
    payload = json.loads(path.read_text())
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=("cpu", "issue", "gpu"), default="cpu")
    parser.add_argument("--smoke", action="store_true", help="seconds-long run (tests)")
    parser.add_argument("--map", action="store_true", help="where the old default stalls (see module docstring)")
    parser.add_argument("--lrs", type=float, nargs="+", help="peak learning rates (default: the preset's grid)")
    parser.add_argument("--vanilla-steps", type=int, help="optimizer steps of the twin (HiRes: equal FLOPs)")
    parser.add_argument("--archs", nargs="+", choices=VARIANTS, help=f"architectures (default: {' '.join(ARCHS)})")
    parser.add_argument("--ablation", action="store_true", help="each part of the fix alone (ABLATION_CELLS)")
    parser.add_argument("--old-lrs", type=float, nargs="+", help="run hires-old-default at these rates only")
    parser.add_argument("--width", type=int, help="hidden size d of the preset's shape (D = 2d, heads of 64)")
    parser.add_argument("--extend", action="store_true", help="add the missing cells to the grid already written")
    parser.add_argument("--seed", type=int, default=0, help="initialisation and batch order (default 0)")
    parser.add_argument("--name", help="file name of the outputs (default: stability or stability_gpu)")
    parser.add_argument("--render", type=Path, help="rewrite the table and figure of a finished (or cut-off) JSON")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.render:
        payload = json.loads(args.render.read_text())
        plot(payload, args.render.with_suffix(".png"))
        diagnostics_figures(payload, args.render.parent, args.render.stem)
        write_text_atomic(args.render.with_suffix(".md"), markdown(payload))
        print(markdown(payload))
        return 0
    command = "python benchmarks/stability.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.map:
        print(map_markdown(run_map(args.out_dir, command.strip())))
        return 0
    presets = {"cpu": StabilitySettings, "issue": StabilitySettings.issue, "gpu": StabilitySettings.gpu}
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
    shape_name = {"cpu": "CPU shape", "issue": "the d=192 CPU reproduction", "gpu": "GPU shape"}[args.preset]
    shape_name += f" at d={args.width}" if args.width else ""
    title = f"HiRes vs its twin over a learning-rate grid ({shape_name}, seed {args.seed})"
    if args.ablation:
        settings = replace(settings, cells=ABLATION_CELLS)
        name, title = args.name or "stability_ablation", "Each part of the fix alone (CPU shape)"
    payload = run(settings, args.out_dir, name, title, command.strip(), extend=args.extend)
    print(markdown(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
