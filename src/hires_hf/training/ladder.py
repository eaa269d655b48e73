"""The scaling ladder: HiRes and the vanilla baseline trained at several sizes, each pair at equal counted FLOPs.

What `hires-hf scaling` needs to fit `L(C) = A * C**-alpha` per architecture is a set of (counted training
FLOPs, final validation loss) points. The ladder makes them with the experiment harness
(`hires_hf.experiments.harness`: one data path, one shape rule, one FLOP budget, one loop):

- one byte-level BPE trained once and shared by every run (a loss is only comparable under one tokenizer);
- each size (a rung) is a harness `Shape` ("DxL": heads of `head_dim`, SwiGLU ~8d/3 rounded up to a multiple
  of 8, D = `width_factor` * d, k = `layers_per_block`), the same config `hires-hf compare` builds for that DxL;
- the baseline ("vanilla" in the records) is the control: the Llama twin with HiRes's embedding scale (the
  strongest simple vanilla); `plain_twin` adds transformers' twin as it ships ("plain-twin") as a second row;
- each rung gets one FLOPs budget `C_i`, spent by every architecture alike: HiRes pays for its read / write
  projections with fewer tokens (compute, not parameters: docs/architecture.md);
- budgets grow as the square of the baseline's FLOPs per token, so tokens grow in proportion to model cost
  (a fixed tokens-per-parameter ratio, the shape of a compute-optimal frontier); the common scale is chosen
  from synchronised timed steps of every model on the training device, so that the ladder fits its
  wall-clock budget;
- each architecture at its own learning rate: given `lr_sweep`, each is swept at the smallest rung through the
  harness's `sweep_rates` (the grid extended x2 until its best rate is bracketed, else flagged) and its best rate
  is carried up the ladder unchanged (no 1/width rule: the write multiplier already scales the write's step
  with the width); one rung up, the carried rate is checked against x2 and /2 (records with `role`
  "rate-check"). A sweep never chooses rates from runs shorter than `MIN_STEPS` optimizer steps: a timed ladder
  refuses, a fixed-step smoke ladder says so in one line;
- every (size, seed) pair sees the same batches in the same order; seeds give the spread;
- optionally one MoE point (`moe_size`): an OLMoE-shaped HiRes-MoE and its OLMoE baseline, same protocol.

The RUNS file (JSONL, rewritten atomically after every run) holds one record per run with the fields
`hires_hf.eval.scaling.read_runs` reads (`arch`, `params`, `flops`, `loss`) plus the rung, seed, role, learning
rate, tokens, timings and the validation curve (`curve`: [[flops, loss], ...]); only `role` "ladder" records
and each architecture's winning sweep run enter the fits.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from tqdm.auto import tqdm
from transformers import PreTrainedConfig

from ..accounting import train_flops_per_token
from ..configuration_hires import PRESETS, HiResConfig
from ..errors import HiResUserError
from ..experiments.harness import (
    CONTROL,
    HIRES,
    LR_STEP,
    MAX_EXTENSIONS,
    PLAIN,
    Arm,
    Budget,
    Data,
    Shape,
    control_multiplier,
    prepare_data,
    sweep_rates,
    train_run,
)
from ..experiments.harness import Run as HarnessRun
from ..io import write_text_atomic
from ..twins import vanilla_config
from .loop import pick_device, time_train_step
from .trainer import ensure_writable

ARCHS = ("hires", "vanilla")  # "vanilla": the baseline (the control unless `scaled_twin=False`)
PLAIN_TWIN = "plain-twin"
RESERVE = 0.30  # share of the budget kept for data, evaluation, model building and a busy shared CPU
CUDA_RESERVE = 0.10  # a GPU's synchronised timings hold: keep less back
RUN_OVERHEAD_SECONDS = 3.0  # per run: building the model, the evaluations
# A learning rate chosen from runs shorter than this says little about the architecture (at 20 steps the warmup
# is one step and the sweep mostly ranks how fast each rate warms up): the smallest rung, where the sweep runs,
# must give every architecture at least this many optimizer steps.
MIN_STEPS = 80
SIZE_PATTERN = re.compile(r"^(\d+)x(\d+)$")
ROLES = ("sweep", "ladder", "rate-check", "moe")


@dataclass(frozen=True)
class LadderSettings:
    """One ladder; `smoke()` is the seconds-long version tests use, `gpu()` the one-H200 preset.

    `sizes`: "DxL" (compute width d and depth L; the harness's `Shape` with D = width_factor * d,
    k = layers_per_block, heads of `head_dim` dims) or a preset name (taken as it is but for the vocabulary,
    which the shared tokenizer sets). The CPU defaults are the `ladder-1..4` presets at half their width.
    """

    sizes: tuple[str, ...] = ("32x4", "48x4", "64x6", "96x8")
    seeds: int = 3
    budget_minutes: float = 30.0
    width_factor: int = 2
    layers_per_block: int = 2
    head_dim: int = 16
    vocab_size: int = 512
    block_size: int = 128
    batch_size: int = 4
    learning_rate: float = 2e-3  # without a sweep: every architecture's peak rate
    hires_learning_rate: float | None = None  # without a sweep: HiRes's own (None: `learning_rate`)
    scaled_twin: bool = True  # the baseline is the control (the twin with HiRes's embedding scale; twins.py)
    plain_twin: bool = False  # add transformers' twin as it ships, a second row
    lr_sweep: tuple[float, ...] = (1e-3, 2e-3, 4e-3)  # swept (and extended) at the smallest rung; () for none
    seeded_rungs: int | None = None  # only the smallest this many rungs get every seed (None: all rungs)
    moe_size: str | None = None  # "DxL" of one MoE point (HiRes-MoE and its OLMoE baseline), or None
    corpus: str = "stdlib"  # "stdlib" or "python" (the stdlib and site-packages)
    max_chars: int | None = 8_000_000
    validation_fraction: float = 0.05
    eval_blocks: int = 64
    evaluations: int = 8
    smoke_steps: int | None = None  # baseline steps on the smallest rung instead of a timed budget
    threads: int = 1
    device: str = "auto"

    @property
    def archs(self) -> tuple[str, ...]:
        return (*ARCHS, PLAIN_TWIN) if self.plain_twin else ARCHS

    @classmethod
    def smoke(cls, **overrides: Any) -> LadderSettings:
        fields = dict(
            sizes=("16x2", "32x2"),
            seeds=1,
            vocab_size=300,
            block_size=32,
            batch_size=4,
            lr_sweep=(),
            max_chars=150_000,
            eval_blocks=4,
            evaluations=2,
            smoke_steps=3,
            device="cpu",
        )
        return cls(**{**fields, **overrides})

    @classmethod
    def gpu(cls, **overrides: Any) -> LadderSettings:
        """Four rungs from ~6M to ~110M non-embedding parameters for one H200 (bf16, no compile): heads of 64,
        D = 2d, k = 4, context 1024, batches of 32 blocks, a bracketed sweep at the smallest rung, 2 seeds at the
        two smallest rungs, one MoE point; data: this interpreter's Python sources."""
        fields = dict(
            sizes=("256x8", "384x8", "512x12", "768x16"),
            seeds=2,
            seeded_rungs=2,
            budget_minutes=9.0,
            layers_per_block=4,
            head_dim=64,
            vocab_size=8192,
            block_size=1024,
            batch_size=32,
            lr_sweep=(1e-3, 2e-3, 4e-3),
            moe_size="384x8",
            corpus="python",
            max_chars=150_000_000,
            validation_fraction=0.01,
            eval_blocks=64,
            evaluations=6,
            threads=8,
        )
        return cls(**{**fields, **overrides})


@dataclass(frozen=True)
class Rung:
    """One size of the ladder: its harness shape (+ MoE fields), the HiRes config and its twin, with their counted
    FLOPs per token (every architecture's)."""

    name: str
    shape: Shape
    hires: HiResConfig
    vanilla: PreTrainedConfig
    flops_per_token: dict[str, float] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)  # HiResConfig fields on top of the shape (MoE)

    def config(self, arch: str) -> PreTrainedConfig:
        return self.hires if arch == "hires" else self.vanilla


@dataclass(frozen=True)
class Job:
    """One run: a rung, an architecture, a seed, why it runs (`role`) and its peak rate (None: after the sweep)."""

    rung: Rung
    arch: str
    seed: int
    role: str
    learning_rate: float | None
    factor: float = 1.0  # a rate check runs at the carried rate times this


# ---------------------------------------------------------------------------------------------------- sizes
MOE_FIELDS = dict(num_experts=32, num_experts_per_tok=4, qk_norm="full", router_z_loss_coef=0.001)


def size_shape(spec: str, settings: LadderSettings) -> Shape:
    """The harness shape of "DxL" (the ladder's k, D / d, heads and vocabulary) or of a preset."""
    if spec in PRESETS:
        return replace(Shape.from_config(HiResConfig.from_preset(spec)), vocab_size=settings.vocab_size)
    match = SIZE_PATTERN.match(spec)
    if not match:
        raise HiResUserError(
            f"--sizes {spec!r}: expected DxL (compute width x layers, e.g. 64x4) or a preset "
            f"({', '.join(sorted(PRESETS))})."
        )
    d, layers = int(match[1]), int(match[2])
    head = settings.head_dim
    if d % head or d == 0:
        raise HiResUserError(f"--sizes {spec!r}: the width must be a positive multiple of {head} (head size).")
    if layers % settings.layers_per_block or layers == 0:
        raise HiResUserError(
            f"--sizes {spec!r}: {layers} layers do not split into blocks of {settings.layers_per_block} "
            "(--layers-per-block); pick L a multiple of k."
        )
    return Shape.parse(
        spec,
        layers_per_block=settings.layers_per_block,
        residual_ratio=float(settings.width_factor),
        head_dim=head,
        vocab_size=settings.vocab_size,
    )


def parse_size(
    spec: str, settings: LadderSettings, tokens: dict[str, int | None] | None = None, moe: bool = False
) -> HiResConfig:
    """A rung's HiRes config from "DxL" or a preset name; `tokens` are the tokenizer's special token ids.

    `moe`: OLMoE-shaped layers instead of dense SwiGLU (32 experts, top 4, experts d/2 wide, full q/k norm,
    load-balancing and z losses), so that the twin is transformers' OLMoE."""
    return _shape_and_config(spec, settings, tokens, moe)[1]


def _moe_fields(shape: Shape, moe: bool) -> dict[str, Any]:
    if not moe:
        return {}
    return {**MOE_FIELDS, "moe_intermediate_size": shape.hidden_size // 2, "output_router_logits": True}


def _shape_and_config(
    spec: str, settings: LadderSettings, tokens: dict[str, int | None] | None, moe: bool
) -> tuple[Shape, HiResConfig, dict[str, Any]]:
    shape = size_shape(spec, settings)
    fields = _moe_fields(shape, moe)
    try:
        return shape, shape.config(tokens or {}, settings.block_size, **fields), fields
    except (ValueError, StrictDataclassError) as error:  # the config's validation names the field and what is allowed
        raise HiResUserError(f"--sizes {spec!r}: {error.__cause__ or error}") from error


def make_rung(spec: str, settings: LadderSettings, tokens: dict[str, int | None] | None, moe: bool = False) -> Rung:
    shape, hires, fields = _shape_and_config(spec, settings, tokens, moe)
    twin = vanilla_config(hires)
    flops = {arch: train_flops_per_token(config, settings.block_size) for arch, config in zip(ARCHS, (hires, twin))}
    flops[PLAIN_TWIN] = flops["vanilla"]  # the control's embedding scale is not counted: the same layers
    return Rung(f"{spec}-moe" if moe else spec, shape, hires, twin, flops, fields)


def build_rungs(settings: LadderSettings, tokens: dict[str, int | None] | None = None) -> list[Rung]:
    """Every size as a (HiRes, twin) pair, smallest FLOPs per token first."""
    check_settings(settings)
    rungs = [make_rung(spec, settings, tokens) for spec in settings.sizes]
    return sorted(rungs, key=lambda rung: rung.flops_per_token["vanilla"])


def arm_of(rung: Rung, arch: str, settings: LadderSettings) -> Arm:
    """The harness arm that trains `arch` at this rung: HiRes, the baseline (the control), the plain twin."""
    kind = {"hires": HIRES, "vanilla": CONTROL if settings.scaled_twin else PLAIN, PLAIN_TWIN: PLAIN}[arch]
    return Arm(arch, kind, dict(rung.fields))


def check_settings(settings: LadderSettings) -> None:
    """Refuse a ladder that cannot give a fit, before any data is read."""
    if len(settings.sizes) < 2:
        raise HiResUserError(f"--sizes: a scaling fit needs at least 2 sizes; got {list(settings.sizes)}.")
    if len(set(settings.sizes)) != len(settings.sizes):
        raise HiResUserError(f"--sizes: each size once please; got {list(settings.sizes)}.")
    if settings.seeds < 1:
        raise HiResUserError(f"--seeds must be at least 1; got {settings.seeds}.")
    if not settings.budget_minutes > 0:
        raise HiResUserError(f"--budget-minutes must be positive; got {settings.budget_minutes}.")
    if settings.width_factor < 1:
        raise HiResUserError(f"--width-factor (D / d) must be at least 1; got {settings.width_factor}.")
    if settings.layers_per_block < 1:
        raise HiResUserError(f"--layers-per-block must be at least 1; got {settings.layers_per_block}.")
    for flag, value in (("--lr", settings.learning_rate), ("--hires-lr", settings.hires_learning_rate)):
        if value is not None and not value > 0:
            raise HiResUserError(f"{flag} must be a positive learning rate; got {value}.")
    if any(not rate > 0 for rate in settings.lr_sweep):
        raise HiResUserError(f"--lr-sweep: every rate must be positive; got {list(settings.lr_sweep)}.")
    if settings.corpus not in ("stdlib", "python"):
        raise HiResUserError(f"--corpus must be 'stdlib' or 'python'; got {settings.corpus!r}.")
    for spec in settings.sizes:
        parse_size(spec, settings)
    if settings.moe_size is not None:
        parse_size(settings.moe_size, settings, moe=True)


# ---------------------------------------------------------------------------------------------------- plan
def plan_jobs(rungs: Sequence[Rung], settings: LadderSettings, moe_rung: Rung | None = None) -> list[Job]:
    """Every run in the order it trains: the sweep's grid (extended while it runs), then seed 0 up the ladder,
    extra seeds, the MoE point, the check of the carried rate. An interrupted ladder still leaves whole seed-0
    ladders in the RUNS file."""
    archs = settings.archs
    if not settings.lr_sweep:
        return [
            Job(rung, arch, seed, "ladder", learning_rate_of(arch, settings))
            for seed in range(settings.seeds)
            for rung in rungs
            for arch in archs
        ]
    seeded = len(rungs) if settings.seeded_rungs is None else settings.seeded_rungs
    jobs = [Job(rungs[0], arch, 0, "sweep", rate) for arch in archs for rate in settings.lr_sweep]
    jobs += [Job(rung, arch, 0, "ladder", None) for rung in rungs[1:] for arch in archs]
    jobs += [
        Job(rung, arch, seed, "ladder", None)
        for seed in range(1, settings.seeds)
        for rung in rungs[:seeded]
        for arch in archs
    ]
    if moe_rung is not None:
        jobs += [Job(moe_rung, arch, 0, "moe", None) for arch in archs]
    jobs += [Job(rungs[1], arch, 0, "rate-check", None, f) for arch in archs for f in (1 / LR_STEP, LR_STEP)]
    return jobs


def budgets(rungs: Sequence[Rung], scale: float) -> list[float]:
    """Counted training FLOPs of each rung: `scale * f_i**2` (tokens = scale * f_i, f_i the twin's FLOPs/token)."""
    return [budget_of(rung, scale) for rung in rungs]


def budget_of(rung: Rung, scale: float) -> float:
    return scale * rung.flops_per_token["vanilla"] ** 2


def time_scale(
    jobs: Sequence[Job],
    settings: LadderSettings,
    seconds_per_step: dict[tuple[str, str], float],
    spent: float,
    reserve: float = RESERVE,
) -> float:
    """The largest scale whose runs all fit the wall-clock budget, with room for every extension a sweep may add.

    A run of C FLOPs at f FLOPs/token and t seconds per step of T tokens takes C * t / (f * T) seconds.
    """
    tokens_per_step = settings.batch_size * settings.block_size
    extensions = [job for job in jobs if job.role == "sweep" and job.learning_rate == settings.lr_sweep[0]]
    planned = [*jobs, *(job for job in extensions for _ in range(MAX_EXTENSIONS))]
    seconds_per_unit = sum(
        job.rung.flops_per_token["vanilla"] ** 2
        * seconds_per_step[job.rung.name, job.arch]
        / (job.rung.flops_per_token[job.arch] * tokens_per_step)
        for job in planned
    )
    left = settings.budget_minutes * 60 * (1 - reserve) - spent - len(planned) * RUN_OVERHEAD_SECONDS
    return max(left, 0.0) / seconds_per_unit


def smoke_scale(rungs: Sequence[Rung], settings: LadderSettings) -> float:
    """The scale that gives the smallest rung's twin exactly `smoke_steps` steps."""
    tokens = (settings.smoke_steps + 1e-9) * settings.batch_size * settings.block_size
    return tokens / rungs[0].flops_per_token["vanilla"]


def learning_rate_of(arch: str, settings: LadderSettings) -> float:
    """Without a sweep each architecture trains at its given peak rate (`--lr`, `--hires-lr`)."""
    if arch == "hires" and settings.hires_learning_rate is not None:
        return settings.hires_learning_rate
    return settings.learning_rate


def steps_for(budget: float, flops_per_token: float, settings: LadderSettings) -> int:
    return Budget(budget, settings.batch_size).steps(flops_per_token, settings.block_size)


# ---------------------------------------------------------------------------------------------------- running
def run_ladder(
    settings: LadderSettings,
    out: str | Path,
    progress: bool = True,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Train every planned run, write the RUNS file after each run, return its records."""
    started = time.perf_counter()
    out = Path(out)
    check_settings(settings)
    ensure_writable(out.parent if str(out.parent) else Path("."))
    device = pick_device(settings.device)
    before = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        data = prepare_data(
            settings.corpus,
            settings.vocab_size,
            settings.block_size,
            settings.max_chars,
            settings.validation_fraction,
            settings.eval_blocks,
            progress=progress,
        )
        rungs = build_rungs(settings, data.special)
        moe_rung = make_rung(settings.moe_size, settings, data.special, moe=True) if settings.moe_size else None
        jobs = plan_jobs(rungs, settings, moe_rung)
        scale, timings = plan_scale(rungs, jobs, settings, device, time.perf_counter() - started, progress)
        records = _train_all(jobs, scale, timings, settings, data, device, out, progress, on_run)
    finally:
        torch.set_num_threads(before)
    return records


def plan_scale(
    rungs: Sequence[Rung],
    jobs: Sequence[Job],
    settings: LadderSettings,
    device: torch.device,
    spent: float,
    progress: bool = True,
) -> tuple[float, dict[tuple[str, str], float]]:
    """The budgets' scale and the seconds per step of every (size, arch) on `device`: fixed steps for a smoke
    run (no timings), otherwise timed steps of every model turned into the scale that fits the budget. A sweep
    whose runs would be shorter than MIN_STEPS is refused (timed) or flagged in one line (smoke)."""
    if settings.smoke_steps is not None:
        scale, timings = smoke_scale(rungs, settings), {}
    else:
        models = {(job.rung.name, job.arch): job.rung.config(job.arch) for job in jobs}
        timings = {
            key: time_train_step(config, settings.batch_size, settings.block_size, device)
            for key, config in tqdm(models.items(), desc="timing steps", leave=False, disable=not progress)
        }
        spent += sum(timings.values()) * 4  # each timing ran a warm-up step and three timed ones
        scale = time_scale(jobs, settings, timings, spent, CUDA_RESERVE if device.type == "cuda" else RESERVE)
    smallest = steps_for(budget_of(rungs[0], scale), rungs[0].flops_per_token["hires"], settings)
    if smallest < MIN_STEPS:
        what = "a sweep chooses rates from them" if settings.lr_sweep else "the smallest size says little"
        if settings.smoke_steps is None:
            raise HiResUserError(
                f"--budget-minutes {settings.budget_minutes:g} leaves {smallest} step(s) for the smallest size "
                f"(at least {MIN_STEPS} needed: {what}): raise the budget, use fewer --seeds, or drop the largest "
                "size."
            )
        print(
            f"note: {smallest} step(s) at the smallest size, under {MIN_STEPS}: a smoke ladder; {what}", file=sys.stderr
        )
    return scale, timings


def _train_all(jobs, scale, timings, settings, data, device, out, progress, on_run) -> list[dict[str, Any]]:
    tokens_per_step = settings.batch_size * settings.block_size

    def job_flops(job: Job) -> int:
        per_step = int(job.rung.flops_per_token[job.arch] * tokens_per_step)
        return steps_for(budget_of(job.rung, scale), job.rung.flops_per_token[job.arch], settings) * per_step

    bar = tqdm(total=sum(map(job_flops, jobs)), unit="FLOP", unit_scale=True, desc="ladder", disable=not progress)
    records: list[dict[str, Any]] = []

    def run(job: Job, rate: float) -> dict[str, Any]:
        bar.set_postfix_str(f"{job.rung.name} {job.arch} seed {job.seed} lr {rate:.2g} ({job.role})")
        guard = timings.get((job.rung.name, job.arch))
        try:
            record = train_one(job, rate, budget_of(job.rung, scale), settings, data, device, bar, guard)
        except (RuntimeError, ValueError) as error:  # one broken run (e.g. out of memory) must not end the ladder
            record = failed_record(job, rate, error)
            tqdm.write(f"{job.rung.name} {job.arch} seed {job.seed} failed: {record['error']}")
        records.append(record)
        write_runs(out, records)
        if on_run is not None:
            on_run(record)
        return record

    with bar:
        swept: set[str] = set()
        for job in jobs:
            if job.role == "sweep" and job.arch not in swept:  # the architecture's whole sweep, extended as it runs
                swept.add(job.arch)
                _sweep(job, settings, run)
            elif job.role != "sweep":
                run(job, job.learning_rate or _carried_rate(job, records, settings))
    return records


def _sweep(job: Job, settings: LadderSettings, run: Callable[[Job, float], dict[str, Any]]) -> None:
    """The harness's bracketing sweep of one architecture at the smallest rung; its status goes on its records."""
    records: list[dict[str, Any]] = []

    def train(rate: float) -> HarnessRun:
        record = run(replace(job, learning_rate=rate), rate)
        records.append(record)
        return HarnessRun(job.arch, rate, job.seed, record.get("steps", 0), 0.0, record["loss"], [], 0.0, 0.0, False)

    _, status = sweep_rates(train, settings.lr_sweep)
    for record in records:
        record["bracket"] = status


def best_rates(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each architecture's best swept peak rate (lowest final validation loss, diverged runs excluded)."""
    best: dict[str, tuple[float, float]] = {}
    for record in records:
        if record["role"] == "sweep" and math.isfinite(record["loss"]):
            if record["arch"] not in best or record["loss"] < best[record["arch"]][0]:
                best[record["arch"]] = (record["loss"], record["learning_rate"])
    return {arch: rate for arch, (_, rate) in best.items()}


def _carried_rate(job: Job, records: Sequence[dict[str, Any]], settings: LadderSettings) -> float:
    """A run after the sweep: the architecture's best swept rate, unchanged (a rate check: times its factor)."""
    return best_rates(records).get(job.arch, settings.lr_sweep[0]) * job.factor


def train_one(
    job: Job,
    learning_rate: float,
    budget: float,
    settings: LadderSettings,
    data: Data,
    device: torch.device,
    bar: tqdm,
    step_seconds: float | None = None,
) -> dict[str, Any]:
    """One run of `budget` counted FLOPs through the harness's `train_run`; the RUNS record of what it did.

    A sweep run at the smallest rung with seed 0 is also that rung's ladder point when its rate wins; the
    record says so (`role` stays "sweep", `fit` says whether it is one of the fitted points)."""
    rung, arch = job.rung, job.arch
    arm = arm_of(rung, arch, settings)
    params: list[int] = []
    per_step = int(rung.flops_per_token[arch] * settings.batch_size * settings.block_size)
    run = train_run(
        arm,
        learning_rate,
        rung.shape,
        data,
        Budget(budget, settings.batch_size),
        seed=job.seed,
        device=device,
        evaluations=settings.evaluations,
        keep=lambda model: params.append(sum(p.numel() for p in model.parameters())),
        on_step=lambda _: bar.update(per_step),
    )
    if device.type == "cuda":
        torch.cuda.empty_cache()
    config, trained = rung.hires, rung.config(arch)
    tokens = run.steps * settings.batch_size * settings.block_size
    return {
        "arch": arch,
        "params": params[0],
        "flops": tokens * run.flops_per_token,
        "loss": run.final_loss,
        "size": rung.name,
        "seed": job.seed,
        "role": job.role,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "residual_size": config.residual_size if arch == "hires" else config.hidden_size,
        "layers_per_block": config.layers_per_block if arch == "hires" else None,
        "num_experts": config.num_experts,
        "model_type": trained.model_type,
        "twin_embedding_multiplier": control_multiplier(config) if arm.kind == CONTROL else None,
        "budget_flops": budget,
        "flops_per_token": run.flops_per_token,
        "tokens": tokens,
        "steps": run.steps,
        "planned_steps": steps_for(budget, run.flops_per_token, settings),
        "diverged": run.diverged,
        "train_seconds": run.seconds,
        "planned_seconds": run.steps * step_seconds if step_seconds else None,
        "tokens_per_second": run.tokens_per_second,
        "block_size": settings.block_size,
        "batch_size": settings.batch_size,
        "learning_rate": learning_rate,
        "vocab_size": settings.vocab_size,
        "eval_blocks": int(data.validation.shape[0]),
        "device": str(device),
        "dtype": "bf16-autocast" if device.type == "cuda" else "fp32",
        "curve": [[flops, loss] for flops, loss in run.curve],
    }


def failed_record(job: Job, learning_rate: float, error: Exception) -> dict[str, Any]:
    """The RUNS record of a run that raised: kept (with the error's first line) but never fitted."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {
        "arch": job.arch,
        "size": job.rung.name,
        "seed": job.seed,
        "role": job.role,
        "learning_rate": learning_rate,
        "hidden_size": job.rung.hires.hidden_size,
        "loss": float("inf"),
        "error": str(error).splitlines()[0][:300] if str(error) else type(error).__name__,
    }


def _is_fitted(record: dict[str, Any], best: dict[str, float]) -> bool:
    if "error" in record:
        return False
    role = record.get("role", "ladder")
    return role == "ladder" or (role == "sweep" and best.get(record["arch"]) == record["learning_rate"])


def write_runs(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """The RUNS file, one record a line, through a temporary file (a reader never sees half of it); `fit` marks
    the records a scaling fit uses: the ladder runs and each architecture's winning sweep run, not the sweep's
    losers, the rate check, the MoE point or a failed run."""
    best = best_rates(records)
    write_text_atomic(path, "".join(json.dumps({**r, "fit": _is_fitted(r, best)}) + "\n" for r in records))


def settings_with(settings: LadderSettings, **changes: Any) -> LadderSettings:
    """A copy with the given fields changed (None leaves a field as it is)."""
    return replace(settings, **{key: value for key, value in changes.items() if value is not None})


__all__ = [
    "MIN_STEPS",
    "Job",
    "LadderSettings",
    "Rung",
    "arm_of",
    "best_rates",
    "budgets",
    "build_rungs",
    "make_rung",
    "parse_size",
    "plan_jobs",
    "run_ladder",
    "settings_with",
    "size_shape",
    "time_scale",
    "write_runs",
]
