"""Scaling-law fits and the FLOPs-efficiency multiplier of HiRes over its baseline (the paper's claim: 1.30x).

Per architecture, fit `L(C) = A * C**-alpha` (or `A * C**-alpha + E` with an irreducible loss) to runs of
(training FLOPs C, final validation loss L). The multiplier at HiRes compute C solves
`L_baseline(C') = L_hires(C)` and reports `C' / C`: how much more compute the baseline needs for the same loss
(1.30 means HiRes reaches the baseline's loss at 1 / 1.30 = 77% of the compute). A residual bootstrap gives its
confidence interval. The baseline is the `control` (the Llama twin with HiRes's embedding scale) unless named.

RUNS file: JSON (a list of records, or {"runs": [...]}) or JSONL (one record a line); each record is
`{"arch": "hires" | "control" | ..., "params": int, "flops": float, "loss": float}`, FLOPs counted by
`hires_hf.accounting`. Extra keys are kept and ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import HiResUserError
from ..tables import markdown_table

# The paper's fitted FLOPs efficiency of HiRes over its vanilla baseline, the claim every comparison tests.
ARTICLE_MULTIPLIER = 1.30

REQUIRED_FIELDS = ("arch", "params", "flops", "loss")


@dataclass(frozen=True)
class Point:
    """One point of a scaling fit: what was trained, the compute it took, the loss it reached (one run, or the
    mean of a cell's seeds)."""

    arch: str
    params: int
    flops: float
    loss: float


def _run_from_record(record: object, where: str) -> Point:
    if not isinstance(record, dict):
        raise HiResUserError(f"{where}: a run must be an object with {', '.join(REQUIRED_FIELDS)}; got {record!r}.")
    missing = [name for name in REQUIRED_FIELDS if name not in record]
    if missing:
        raise HiResUserError(f"{where}: run is missing {', '.join(missing)}; each run needs {REQUIRED_FIELDS}.")
    arch = record["arch"]
    if not isinstance(arch, str) or not arch:
        raise HiResUserError(f"{where}: arch must be a non-empty string; got {arch!r}.")
    for name in ("params", "flops", "loss"):
        value = record[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise HiResUserError(f"{where}: {name} must be a positive number; got {value!r}.")
    return Point(arch=arch, params=int(record["params"]), flops=float(record["flops"]), loss=float(record["loss"]))


def _jsonl_records(path: Path, text: str) -> list[tuple[str, object]]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((f"{path}:{number}", json.loads(line)))
        except json.JSONDecodeError as error:
            raise HiResUserError(f"{path}:{number}: not valid JSON ({error.msg}); write one run per line.") from None
    return records


def read_runs(path: str | Path) -> list[Point]:
    """Runs from a JSON or JSONL file; a malformed record is reported with its line (JSONL) or index (JSON)."""
    path = Path(path)
    if not path.is_file():
        raise HiResUserError(f"runs file {str(path)!r} does not exist.")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # not one JSON document: one run a line
        records = _jsonl_records(path, text)
    else:  # a list of runs, {"runs": [...]}, or a JSONL file of a single run
        data = data["runs"] if isinstance(data, dict) and "runs" in data else data
        records = [
            (f"{path} run {i + 1}", record) for i, record in enumerate(data if isinstance(data, list) else [data])
        ]
    records = [(where, record) for where, record in records if not _left_out(record)]
    if not records:
        raise HiResUserError(f"{path} holds no runs.")
    return [_run_from_record(record, where) for where, record in records]


def _left_out(record: object) -> bool:
    """A ladder record marked `"fit": false` (a learning-rate sweep loser, a rule check, the MoE point)."""
    return isinstance(record, dict) and record.get("fit") is False


@dataclass(frozen=True)
class PowerLaw:
    """L(C) = A * C**-alpha + E."""

    A: float
    alpha: float
    E: float = 0.0

    def loss(self, compute: np.ndarray | float) -> np.ndarray:
        return self.A * np.asarray(compute, dtype=float) ** -self.alpha + self.E

    def compute_for(self, loss: np.ndarray | float) -> np.ndarray:
        """The compute at which the law reaches `loss`; inf where the loss is at or below E (never reached)."""
        gap = np.asarray(loss, dtype=float) - self.E
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(gap > 0, (self.A / np.where(gap > 0, gap, 1.0)) ** (1.0 / self.alpha), np.inf)


def _fit_log_linear(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of y = a - alpha * x for centred x; y may be (n,) or (candidates, n). Returns (a, alpha)."""
    a = y.mean(axis=-1)
    alpha = -(y * x).sum(axis=-1) / (x * x).sum()
    return a, alpha


def _log_residual(x: np.ndarray, log_loss: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Sum of squared log-loss residuals of the best law for each candidate irreducible loss `e` (shape (k,))."""
    a, alpha = _fit_log_linear(x, np.log(np.exp(log_loss) - e[:, None]))
    predicted = np.exp(a[:, None] - alpha[:, None] * x) + e[:, None]
    return ((log_loss - np.log(predicted)) ** 2).sum(axis=-1)


def fit_power_law(flops: Sequence[float], losses: Sequence[float], irreducible: bool = False) -> PowerLaw:
    """Least squares in log-loss space (relative errors, as losses are compared by ratio).

    Without E this is linear regression on the log-log points. With E, E is profiled: for each candidate E in
    [0, min L) the rest is linear, and the E whose fit leaves the smallest log-loss residual wins (grid, then
    golden-section refinement), so no optimiser start values are needed.
    """
    log_c = np.log(np.asarray(flops, dtype=float))
    log_loss = np.log(np.asarray(losses, dtype=float))
    center = log_c.mean()  # regress on centred log C: intercepts stay well conditioned at C ~ 1e18
    x = log_c - center
    e = 0.0
    if irreducible:
        top = math.exp(log_loss.min()) * (1 - 1e-9)
        grid = np.linspace(0.0, top, 201)[:-1]
        best = int(np.argmin(_log_residual(x, log_loss, grid)))
        low, high = grid[max(best - 1, 0)], grid[best + 1] if best + 1 < len(grid) else top
        golden = (math.sqrt(5) - 1) / 2
        for _ in range(50):
            left, right = high - golden * (high - low), low + golden * (high - low)
            r_left, r_right = _log_residual(x, log_loss, np.array([left, right]))
            low, high = (low, right) if r_left < r_right else (left, high)
        e = (low + high) / 2
    a, alpha = _fit_log_linear(x, np.log(np.exp(log_loss) - e))
    return PowerLaw(A=math.exp(float(a) + float(alpha) * center), alpha=float(alpha), E=float(e))


def efficiency_multiplier(
    hires: PowerLaw, baseline: PowerLaw, at_compute: float | None = None, at_loss: float | None = None
) -> float:
    """C_baseline / C_hires for the same loss: at HiRes compute `at_compute`, or at loss `at_loss` (one of them)."""
    if (at_compute is None) == (at_loss is None):
        raise ValueError("give exactly one of at_compute and at_loss.")
    if at_loss is None:
        at_loss = float(hires.loss(at_compute))
    else:
        at_compute = float(hires.compute_for(at_loss))
    return float(baseline.compute_for(at_loss)) / at_compute


def _minimum_points(irreducible: bool) -> int:
    return 3 if irreducible else 2


@dataclass
class ArchFit:
    arch: str
    law: PowerLaw
    runs: list[Point]
    rmse_log: float  # root-mean-square residual of log L: the relative scatter around the fit


@dataclass
class Multiplier:
    arch: str
    baseline: str
    at_compute: float
    at_loss: float
    value: float
    ci_low: float
    ci_high: float
    confidence: float


@dataclass
class ScalingReport:
    fits: dict[str, ArchFit]
    multipliers: list[Multiplier] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "fits": {
                arch: {
                    **asdict(fit.law),
                    "points": len(fit.runs),
                    "rmse_log": fit.rmse_log,
                    "runs": [asdict(run) for run in fit.runs],
                }
                for arch, fit in self.fits.items()
            },
            "multipliers": [asdict(multiplier) for multiplier in self.multipliers],
        }


def fit_architectures(runs: Sequence[Point], irreducible: bool = False) -> dict[str, ArchFit]:
    """One law per architecture; each needs enough distinct compute values to pin its parameters."""
    by_arch: dict[str, list[Point]] = {}
    for run in runs:
        by_arch.setdefault(run.arch, []).append(run)
    fits = {}
    for arch, arch_runs in by_arch.items():
        distinct = len({run.flops for run in arch_runs})
        needed = _minimum_points(irreducible)
        if distinct < needed:
            raise HiResUserError(
                f"arch {arch!r} has {distinct} distinct compute value(s); a fit{' with E' if irreducible else ''} "
                f"needs at least {needed}. Add runs at more sizes."
            )
        arch_runs = sorted(arch_runs, key=lambda run: run.flops)
        flops, loss = [run.flops for run in arch_runs], [run.loss for run in arch_runs]
        law = fit_power_law(flops, loss, irreducible)
        rmse = float(np.sqrt(np.mean((np.log(loss) - np.log(law.loss(flops))) ** 2)))
        fits[arch] = ArchFit(arch=arch, law=law, runs=arch_runs, rmse_log=rmse)
    return fits


def _bootstrap_laws(
    fit: ArchFit, irreducible: bool, rng: np.random.Generator, samples: int, noise: float = 0.0
) -> list[PowerLaw]:
    """Refits on the fitted curve plus resampled log residuals (the compute levels are a fixed design). With
    `noise` (nats), each point's residual is drawn from a normal at least that wide instead: a fit through few
    points can lie closer to its points than their seeds do, and must not look more certain than the seeds."""
    flops = np.array([run.flops for run in fit.runs])
    losses = np.array([run.loss for run in fit.runs])
    log_fitted = np.log(fit.law.loss(flops))
    residuals = np.log(losses) - log_fitted
    n, p = len(flops), 3 if irreducible else 2
    residuals *= math.sqrt(n / max(n - p, 1))  # fitted residuals underestimate the noise by about (n - p) / n
    scale = np.maximum(np.sqrt(np.mean(residuals**2)), noise / losses)  # in log-loss units, per point
    laws = []
    for _ in range(samples):
        draw = rng.normal(0.0, scale) if noise > 0 else rng.choice(residuals, size=n, replace=True)
        laws.append(fit_power_law(flops, np.exp(log_fitted + draw), irreducible))
    return laws


def _noise_for(noise: float | Mapping[str, float], arch: str) -> float:
    return noise.get(arch, 0.0) if isinstance(noise, Mapping) else noise


def analyse(
    runs: Sequence[Point],
    baseline: str = "control",
    irreducible: bool = False,
    at_compute: float | None = None,
    at_loss: float | None = None,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    noise: float | Mapping[str, float] = 0.0,
) -> ScalingReport:
    """Fit every architecture; the multiplier of each one over `baseline` (if present) with a bootstrap CI.

    The multiplier is taken at `at_loss`, else at `at_compute`, else at the largest compute that architecture
    was run at (inside the data: no extrapolation of its own law). `noise`: the loss noise of one point in nats
    (e.g. the seed standard deviation), a lower bound on what the bootstrap draws for each point; one number for
    every architecture, or one per architecture (those it does not name: none) where their seeds scatter unequally.
    """
    fits = fit_architectures(runs, irreducible)
    report = ScalingReport(fits=fits)
    if baseline not in fits:
        return report
    rng = np.random.default_rng(seed)
    baseline_laws = _bootstrap_laws(fits[baseline], irreducible, rng, bootstrap, _noise_for(noise, baseline))
    for arch, fit in fits.items():
        if arch == baseline:
            continue
        if at_loss is not None and at_loss <= fit.law.E:
            raise HiResUserError(
                f"--at-loss {at_loss} is at or below {arch}'s fitted irreducible loss {fit.law.E:.4f}."
            )
        compute = None if at_loss is not None else (at_compute or max(run.flops for run in fit.runs))
        value = efficiency_multiplier(fit.law, fits[baseline].law, at_compute=compute, at_loss=at_loss)
        laws = _bootstrap_laws(fit, irreducible, rng, bootstrap, _noise_for(noise, arch))
        draws = np.array(
            [efficiency_multiplier(h, v, compute, at_loss) for h, v in zip(laws, baseline_laws, strict=True)]
        )
        tail = (1 - confidence) / 2 * 100
        low, high = np.percentile(draws, [tail, 100 - tail]) if bootstrap else (math.nan, math.nan)
        report.multipliers.append(
            Multiplier(
                arch=arch,
                baseline=baseline,
                at_compute=compute if compute is not None else float(fit.law.compute_for(at_loss)),
                at_loss=at_loss if at_loss is not None else float(fit.law.loss(compute)),
                value=value,
                ci_low=float(low),
                ci_high=float(high),
                confidence=confidence,
            )
        )
    return report


def report_table(report: ScalingReport) -> str:
    """Markdown: the fitted law of each architecture, then each multiplier with its interval."""
    laws = [
        (arch, len(fit.runs), f"{fit.law.A:.4g}", f"{fit.law.alpha:.4f}", f"{fit.law.E:.4f}", f"{fit.rmse_log:.4f}")
        for arch, fit in report.fits.items()
    ]
    lines = markdown_table(["arch", "points", "A", "alpha", "E", "rms log residual"], laws, align="lrrrrr")
    for m in report.multipliers:
        lines.append(
            f"\nFLOPs-efficiency multiplier of {m.arch} over {m.baseline} at C={m.at_compute:.3g}"
            f" (loss {m.at_loss:.4f}): {m.value:.3f}x ({m.confidence:.0%} CI {m.ci_low:.3f}-{m.ci_high:.3f});"
            f" {m.arch} reaches that loss with {1 / m.value:.0%} of {m.baseline}'s compute."
        )
    return "\n".join(lines)


def plot_fits(report: ScalingReport, path: str | Path) -> Path:
    """PNG of every architecture's points and fitted law on log-log axes (written via a temporary file)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    figure = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    all_flops = [run.flops for fit in report.fits.values() for run in fit.runs]
    grid = np.geomspace(min(all_flops) / 1.5, max(all_flops) * 1.5, 200)
    for arch, fit in report.fits.items():
        law = fit.law
        label = f"{arch}: {law.A:.3g}·C^-{law.alpha:.3f}" + (f" + {law.E:.3f}" if law.E else "")
        (line,) = axes.plot(grid, law.loss(grid), label=label)
        axes.scatter([run.flops for run in fit.runs], [run.loss for run in fit.runs], color=line.get_color(), zorder=3)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))  # losses span less than a decade
    axes.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
    axes.set_xlabel("training FLOPs C")
    axes.set_ylabel("validation loss L")
    title = "Scaling fits"
    if report.multipliers:
        m = report.multipliers[0]
        title += f": {m.arch} is {m.value:.2f}x as FLOPs-efficient as {m.baseline} (CI {m.ci_low:.2f}-{m.ci_high:.2f})"
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8)
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    figure.savefig(temporary, format="png")
    temporary.replace(path)
    return path


__all__ = [
    "ARTICLE_MULTIPLIER",
    "ArchFit",
    "Multiplier",
    "Point",
    "PowerLaw",
    "ScalingReport",
    "analyse",
    "efficiency_multiplier",
    "fit_architectures",
    "fit_power_law",
    "plot_fits",
    "read_runs",
    "report_table",
]
