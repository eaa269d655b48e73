"""`hires-hf compare`: does HiRes pay on *your* data, at *your* budget, against the best simple vanilla?

HiRes (the config you give) and the control (its Llama twin with HiRes's embedding scale; with `--plain-twin`
also the plain twin) train on your data at the same counted training FLOPs per run, each over its own
learning-rate grid extended until its best rate is bracketed, then more seeds at each best rate. The verdict
compares the means at the best rates against the seed spread, and says how many FLOPs the winner needed to reach
the loser's final loss. Under `--out`: `compare.json` (verdict and every run), `loss_vs_flops.png`, and each
architecture's best model as a folder `AutoModelForCausalLM.from_pretrained` loads (with the tokenizer).
"""

from __future__ import annotations

import itertools
import math
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..configuration_hires import HiResConfig
from ..errors import HiResUserError
from ..io import staged_folder, write_json_atomic
from ..loading import load_config
from ..plotting import ARM_COLOURS, Curve, draw_loss_vs_flops, pyplot, save_figure
from ..tables import markdown_table
from ..training.loop import pick_device
from .harness import (
    CONTROL,
    DEFAULT_RATES,
    HIRES,
    Arm,
    Budget,
    Data,
    Run,
    Shape,
    baseline_arms,
    best_run,
    loss_at_flops,
    plan_budget,
    prepare_data,
    save_model,
    sweep_rates,
    train_run,
)

SHAPE = re.compile(r"^\d+x\d+$")


@dataclass(frozen=True)
class NoiseFloor:
    """The compute ladder's measured noise floor (docs/research.md): three control seeds at their best rate, on
    this interpreter's Python sources in batches of 32 x 256 tokens, end within `nats` of each other from
    `tokens` training tokens on (`reached`); or, while not reached, still `spread` apart at the longest length
    run so far (`tokens`). It is a property of that corpus and shape: another corpus has its own."""

    shape: str
    tokens: float
    nats: float
    spread: float
    reached: bool


# The ladder's floor on its recorded corpus (benchmarks/results/ladder/summary.json, "floor"): three control seeds span
# 0.437 / 0.133 / 0.074 / 0.068 / 0.068 nats at 1M / 2M / 4M / 8M / 16M tokens, so no length reaches 0.02 nats.
# A test holds this to the committed summary, so that a re-measured floor cannot leave a stale warning.
NOISE_FLOOR: NoiseFloor | None = NoiseFloor(shape="96x12", tokens=16e6, nats=0.02, spread=0.068, reached=False)


def floor_warning(control_tokens: float, floor: NoiseFloor | None = NOISE_FLOOR) -> str | None:
    """One line when a run is shorter than the measured noise floor: gaps under the seed spread are then noise."""
    if floor is None or control_tokens >= floor.tokens:
        return None
    measured = (
        f"seeds agree within {floor.nats} nats from {floor.tokens / 1e6:g}M tokens"
        if floor.reached
        else f"seeds were still {floor.spread:.3f} nats apart at {floor.tokens / 1e6:g}M tokens"
    )
    return (
        f"Warning: {control_tokens / 1e6:.3g}M control tokens a run is below the noise floor the ladder measured at "
        f"{floor.shape} on Python sources ({measured}; for that corpus, not necessarily yours): read gaps smaller "
        f"than the seed spread as noise, or raise the budget to at least {floor.tokens:.3g} tokens."
    )


RUNS_PER_ARM = 4  # the planning guess for a grid of three plus one extension


@dataclass(frozen=True)
class CompareSettings:
    """What `hires-hf compare` does; the CLI fills it from its flags."""

    data: tuple[str, ...] = ("stdlib",)
    model: str = "ladder-2"
    vocab_size: int | None = None  # None: the config's
    budget_minutes: float | None = 10.0  # wall clock for the whole comparison (all runs, all arms)
    budget_flops: float | None = None  # or: counted training FLOPs per run
    budget_tokens: float | None = None  # or: the FLOPs of this many control tokens per run
    rates: tuple[float, ...] = DEFAULT_RATES
    seeds: int = 1
    plain_twin: bool = False
    context: int = 128
    batch_size: int = 16
    max_chars: int | None = 12_000_000
    eval_blocks: int = 64
    evaluations: int = 8
    device: str = "auto"
    threads: int | None = None
    precision: str = "auto"  # bf16 where bf16 matmuls are native, else fp32; or "bf16" / "fp32"


@dataclass
class ArmResult:
    """Every run of one architecture, its best rate and the seeds at that rate."""

    arm: str
    runs: list[Run] = field(default_factory=list)
    bracket: str = ""

    @property
    def best_lr(self) -> float:
        return best_run([r for r in self.runs if r.seed == 0]).lr

    @property
    def at_best(self) -> list[Run]:
        return sorted((r for r in self.runs if r.lr == self.best_lr), key=lambda r: r.seed)

    @property
    def mean(self) -> float:
        losses = [r.final_loss for r in self.at_best]
        return sum(losses) / len(losses)

    @property
    def spread(self) -> float:
        """Half the range of the seeds' final losses at the best rate (0 with one seed)."""
        losses = [r.final_loss for r in self.at_best]
        return (max(losses) - min(losses)) / 2


def load_hires_config(model: str, vocab_size: int | None = None) -> HiResConfig:
    """A preset, a config.json / model folder (`hires-hf info`'s rules: anything not HiRes is refused), or a
    shape "DxL" (the harness's rule: k=4, D=2d, heads of 64, the package's defaults); `vocab_size` overrides."""
    config = Shape.parse(model).config({}, context=1024) if SHAPE.match(model) else load_config(model)
    if vocab_size:
        config.vocab_size = vocab_size
    return config


def budget_of(settings: CompareSettings, shape: Shape, data: Data, arms: Sequence[Arm], device: torch.device) -> Budget:
    """Counted FLOPs per run (the harness's planner): given, or what the wall-clock budget buys at the control's
    measured speed, shared over the runs the comparison expects (RUNS_PER_ARM per arm, plus the extra seeds)."""
    control = next(a for a in arms if a.kind == CONTROL)
    budget = plan_budget(
        control,
        shape,
        data,
        settings.batch_size,
        flops=settings.budget_flops,
        tokens=None if settings.budget_flops else settings.budget_tokens,
        minutes=None if settings.budget_flops or settings.budget_tokens else settings.budget_minutes,
        runs=len(arms) * (RUNS_PER_ARM + settings.seeds - 1),
        device=device,
        precision=settings.precision,
    )
    for arm in arms:
        if budget.steps(arm.flops_per_token(shape, data), data.context) < 1:
            need = arm.flops_per_token(shape, data) * settings.batch_size * data.context
            raise HiResUserError(
                f"The budget ({budget.flops:.3g} FLOPs a run) buys less than one step of {arm.name} ({need:.3g} "
                "FLOPs): raise the budget, or lower --batch-size / --context."
            )
    return budget


def verdict(results: dict[str, ArmResult]) -> dict[str, Any]:
    """Which of HiRes and the control wins, by how much, against the seed spread; the FLOPs multiplier.

    A winner is named only when the gap exceeds the two seed spreads added; with one seed there is no spread,
    so the line gives the gap and asks for seeds instead of calling it."""
    hires, control = results["hires"], results["control"]
    gap = hires.mean - control.mean  # negative: HiRes is better
    noise = hires.spread + control.spread
    winner, loser = (hires, control) if gap < 0 else (control, hires)
    seeds = len(hires.at_best)
    side = "below" if gap < 0 else "above"
    decided = seeds > 1 and abs(gap) > noise
    if seeds == 1:
        line = f"HiRes ends {abs(gap):.3f} nats {side} the control (one seed each: run --seeds 2+ to judge it)."
    elif not decided:
        line = f"HiRes and the control are within seed noise: {gap:+.3f} nats (spread ±{noise:.3f}, {seeds} seeds)."
    else:
        who = "HiRes beats" if gap < 0 else "HiRes trails"
        line = f"{who} the control by {abs(gap):.3f} nats (mean of {seeds} seeds at each one's best rate; "
        line += f"seed spread ±{noise:.3f})."
    multiplier = flops_multiplier(winner.at_best, loser.mean)
    if multiplier is not None and abs(gap) > noise:
        line += f" {winner.arm} reaches {loser.arm}'s final loss with {multiplier:.2f}x the FLOPs."
    return {
        "line": line,
        "gap": gap,
        "noise": noise,
        "winner": winner.arm if decided else None,
        "flops_multiplier": multiplier,
    }


def flops_multiplier(runs: Sequence[Run], target: float) -> float | None:
    """Share of its budget the (seed-averaged) `runs` need to first reach `target` loss; None if never."""
    points = [f for f, _ in runs[0].curve if f > 0]
    for low, high in itertools.pairwise(points):
        mean_high = sum(loss_at_flops(r, high) for r in runs) / len(runs)
        if mean_high <= target:
            mean_low = sum(loss_at_flops(r, low) for r in runs) / len(runs)
            t = (mean_low - target) / max(mean_low - mean_high, 1e-12)
            return math.exp(math.log(low) + t * (math.log(high) - math.log(low))) / points[-1]
    first = sum(loss_at_flops(r, points[0]) for r in runs) / len(runs)
    return points[0] / points[-1] if first <= target else None


def compare(settings: CompareSettings, out: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the comparison; write `out` whole (a temporary folder renamed at the end) when given."""
    if out is not None and out.exists() and any(out.iterdir()):
        raise HiResUserError(f"--out {out} exists and is not empty: choose a new folder.")
    if settings.seeds < 1:
        raise HiResUserError(f"--seeds must be at least 1; got {settings.seeds}.")
    if settings.threads:
        torch.set_num_threads(settings.threads)
    config = load_hires_config(settings.model, settings.vocab_size)
    shape = Shape.from_config(config)
    device = pick_device(settings.device)
    data = prepare_data(
        settings.data if len(settings.data) > 1 else settings.data[0],
        config.vocab_size,
        settings.context,
        settings.max_chars,
        eval_blocks=settings.eval_blocks,
        progress=progress,
    )
    arms = [Arm("hires", HIRES), *baseline_arms(settings.plain_twin)]
    budget = budget_of(settings, shape, data, arms, device)
    control = next(arm for arm in arms if arm.kind == CONTROL)
    warning = floor_warning(budget.flops / control.flops_per_token(shape, data))
    if warning and progress:
        print(warning)
    with staged_folder(out) if out is not None else _scratch() as staging:
        results = _train_all(settings, shape, data, arms, budget, device, staging, progress)
        summary = _summary(settings, shape, data, budget, results) | {"noise_floor_warning": warning}
        if out is not None:
            write_json_atomic(staging / "compare.json", summary)
            plot(results, staging / "loss_vs_flops.png", summary["verdict"]["line"])
            for name in results:
                shutil.move(staging / "runs" / name / "best", staging / name)
            shutil.rmtree(staging / "runs")
    return summary


@contextmanager
def _scratch() -> Iterator[Path]:
    """A temporary folder for the runs' models when nothing is kept (no --out)."""
    with tempfile.TemporaryDirectory(prefix="hires-compare-") as folder:
        yield Path(folder)


def _train_all(
    settings: CompareSettings,
    shape: Shape,
    data: Data,
    arms: Sequence[Arm],
    budget: Budget,
    device: torch.device,
    staging: Path,
    progress: bool,
) -> dict[str, ArmResult]:
    results = {arm.name: ArmResult(arm.name) for arm in arms}
    planned = len(arms) * (len(settings.rates) + settings.seeds - 1)
    with tqdm(total=planned, desc="compare", unit="run", disable=not progress, dynamic_ncols=True) as bar:
        for arm in arms:
            result = results[arm.name]

            def train(lr: float, seed: int = 0, arm: Arm = arm, result: ArmResult = result) -> Run:
                bar.set_postfix_str(f"{arm.name} lr={lr:g} seed={seed}")
                folder = staging / "runs" / arm.name / f"lr{lr:g}-seed{seed}"
                keep = (lambda model: save_model(model, arm, shape, data, folder)) if seed == 0 else None
                run = train_run(
                    arm, lr, shape, data, budget, seed, device, settings.evaluations, settings.precision, keep=keep
                )
                result.runs.append(run)
                if progress:
                    bar.write(f"{arm.name} lr={lr:g} seed={seed}: {run.final_loss:.3f} after {run.steps} steps")
                bar.total = max(bar.total, bar.n + 1)
                bar.update(1)
                return run

            _, result.bracket = sweep_rates(train, settings.rates)
            for seed in range(1, settings.seeds):
                train(result.best_lr, seed)
            best = staging / "runs" / arm.name / f"lr{result.best_lr:g}-seed0"
            best.rename(staging / "runs" / arm.name / "best")
    return results


def _summary(
    settings: CompareSettings, shape: Shape, data: Data, budget: Budget, results: dict[str, ArmResult]
) -> dict[str, Any]:
    return {
        "verdict": verdict(results),
        "arms": {
            name: {
                "best_lr": r.best_lr,
                "bracket": r.bracket,
                "mean_loss": r.mean,
                "spread": r.spread,
                "seeds": len(r.at_best),
            }
            for name, r in results.items()
        },
        "runs": [run.to_json() for r in results.values() for run in r.runs],
        "budget_flops_per_run": budget.flops,
        "data": {"source": data.source, "context": data.context, "unigram_loss": data.unigram_loss},
        "settings": {k: v for k, v in vars(settings).items()},
        "shape": shape.name,
    }


def table(summary: dict[str, Any]) -> str:
    """The arms side by side, as printed at the end."""
    rows = []
    for name, arm in summary["arms"].items():
        flag = "" if arm["bracket"] == "bracketed" else " ⚠ (extend --lrs)"
        rows.append(
            (name, f"{arm['best_lr']:g}", arm["bracket"] + flag, f"{arm['mean_loss']:.3f}", f"±{arm['spread']:.3f}")
        )
    return "\n".join(markdown_table(["arm", "best lr", "bracket", "final loss (mean)", "seed spread"], rows, "lrlrr"))


def plot(results: dict[str, ArmResult], path: Path, title: str) -> None:
    """Each architecture's seeds at its best rate (seed 0 solid, the others dashed)."""
    curves = [
        Curve(f"{name} (lr {run.lr:g})" if run.seed == 0 else None, run.curve, ARM_COLOURS.get(name), run.seed > 0)
        for name, result in results.items()
        for run in result.at_best
    ]
    figure, axis = pyplot().subplots(figsize=(8, 5))
    draw_loss_vs_flops(axis, curves, title)
    save_figure(figure, path)


__all__ = [
    "NOISE_FLOOR",
    "CompareSettings",
    "NoiseFloor",
    "compare",
    "floor_warning",
    "load_hires_config",
    "table",
    "verdict",
]
