"""The scaling ladder: HiRes and its vanilla twin trained at several sizes, each pair at equal counted FLOPs.

What `hires-hf scaling` needs to fit `L(C) = A * C**-alpha` per architecture is a set of (counted training
FLOPs, final validation loss) points. The ladder makes them on the embedded stdlib corpus:

- one byte-level BPE trained once and shared by every run (a loss is only comparable under one tokenizer);
- each size (a rung) gets one FLOPs budget `C_i`, spent by HiRes and by its vanilla twin alike: HiRes pays
  for its read / write projections with fewer tokens, as HIRES.md §6 asks (compute, not parameters);
- budgets grow as the square of the twin's FLOPs per token, so tokens grow in proportion to model cost
  (a fixed tokens-per-parameter ratio, the shape of a compute-optimal frontier); the common scale is chosen
  from a few timed steps of every model so that the whole ladder fits a wall-clock budget;
- every (size, seed) pair sees the same batches in the same order; seeds give the spread.

The RUNS file (JSONL, rewritten atomically after every run) holds one record per run with the fields
`hires_hf.eval.scaling.read_runs` reads (`arch`, `params`, `flops`, `loss`) plus the rung, seed, tokens,
timings and the validation curve (`curve`: [[flops, loss], ...]).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from tqdm.auto import tqdm
from transformers import PreTrainedConfig, TrainerCallback

from ..configuration_hires import PRESETS, HiResConfig
from ..errors import HiResUserError
from ..twins import vanilla_config
from .data import PackedDataset, load_default_corpus, pack
from .tokenizer import build_tokenizer, encode_documents, special_token_ids
from .trainer import ensure_writable, time_train_step, train_flops_per_token, train_model

HEAD_DIM = 16  # every "DxL" rung uses heads of 16 dims, so that d = 32 still has two heads
ARCHS = ("hires", "vanilla")
RESERVE = 0.30  # share of the budget kept for data, evaluation, Trainer overhead and a busy shared CPU
RUN_OVERHEAD_SECONDS = 3.0  # per run: building the model and the Trainer, the evaluations
MIN_STEPS = 20  # fewer optimizer steps than this on the smallest rung says nothing about the architecture
SIZE_PATTERN = re.compile(r"^(\d+)x(\d+)$")


@dataclass(frozen=True)
class LadderSettings:
    """One ladder; `smoke()` is the seconds-long version tests use.

    `sizes`: "DxL" (compute width d and depth L; D = width_factor * d, k = layers_per_block, heads of 16 dims,
    SwiGLU width ~8d/3) or a preset name (taken as it is but for the vocabulary, which the shared tokenizer
    sets). The defaults are the `ladder-1..4` presets at half their width, which fit a 2-core CPU.
    """

    sizes: tuple[str, ...] = ("32x4", "48x4", "64x6", "96x8")
    seeds: int = 3
    budget_minutes: float = 30.0
    width_factor: int = 2
    layers_per_block: int = 2
    vocab_size: int = 512
    block_size: int = 128
    batch_size: int = 4
    learning_rate: float = 2e-3
    hires_learning_rate: float | None = None  # None: HiRes trains at `learning_rate` too
    max_chars: int = 8_000_000
    tokenizer_sample_chars: int = 1_000_000
    eval_blocks: int = 64
    evaluations: int = 8
    smoke_steps: int | None = None  # vanilla steps on the smallest rung instead of a timed budget
    threads: int = 1

    @classmethod
    def smoke(cls, **overrides: Any) -> LadderSettings:
        fields = dict(
            sizes=("16x2", "32x2"),
            seeds=1,
            vocab_size=300,
            block_size=32,
            batch_size=4,
            max_chars=150_000,
            tokenizer_sample_chars=60_000,
            eval_blocks=4,
            evaluations=2,
            smoke_steps=3,
        )
        return cls(**{**fields, **overrides})


@dataclass(frozen=True)
class Rung:
    """One size of the ladder: the HiRes config and its twin, with their counted FLOPs per token."""

    name: str
    hires: HiResConfig
    vanilla: PreTrainedConfig
    flops_per_token: dict[str, float] = field(default_factory=dict)

    def config(self, arch: str) -> PreTrainedConfig:
        return self.hires if arch == "hires" else self.vanilla


# ---------------------------------------------------------------------------------------------------- sizes
def parse_size(spec: str, settings: LadderSettings, tokens: dict[str, int | None] | None = None) -> HiResConfig:
    """A rung's HiRes config from "DxL" or a preset name; `tokens` are the tokenizer's special token ids."""
    common = {"vocab_size": settings.vocab_size, **(tokens or {})}
    try:
        if spec in PRESETS:
            return HiResConfig.from_preset(spec, **common)
        match = SIZE_PATTERN.match(spec)
        if not match:
            raise HiResUserError(
                f"--sizes {spec!r}: expected DxL (compute width x layers, e.g. 64x4) or a preset "
                f"({', '.join(sorted(PRESETS))})."
            )
        d, layers = int(match[1]), int(match[2])
        if d % HEAD_DIM or d == 0:
            raise HiResUserError(f"--sizes {spec!r}: the width must be a positive multiple of {HEAD_DIM} (head size).")
        if layers % settings.layers_per_block or layers == 0:
            raise HiResUserError(
                f"--sizes {spec!r}: {layers} layers do not split into blocks of {settings.layers_per_block} "
                "(--layers-per-block); pick L a multiple of k."
            )
        return HiResConfig(
            **common,
            hidden_size=d,
            intermediate_size=math.ceil(8 * d / 3 / 8) * 8,  # SwiGLU ~8d/3, a multiple of 8
            num_hidden_layers=layers,
            num_attention_heads=d // HEAD_DIM,
            num_key_value_heads=d // HEAD_DIM,
            max_position_embeddings=max(256, settings.block_size),
            residual_size=settings.width_factor * d,
            layers_per_block=settings.layers_per_block,
        )
    except (ValueError, StrictDataclassError) as error:  # the config's validation names the field and what is allowed
        raise HiResUserError(f"--sizes {spec!r}: {error.__cause__ or error}") from error


def build_rungs(settings: LadderSettings, tokens: dict[str, int | None] | None = None) -> list[Rung]:
    """Every size as a (HiRes, twin) pair, smallest FLOPs per token first."""
    check_settings(settings)
    rungs = []
    for spec in settings.sizes:
        hires = parse_size(spec, settings, tokens)
        twin = vanilla_config(hires)
        flops = {"hires": train_flops_per_token(hires, settings.block_size)}
        flops["vanilla"] = train_flops_per_token(twin, settings.block_size)
        rungs.append(Rung(spec, hires, twin, flops))
    return sorted(rungs, key=lambda rung: rung.flops_per_token["vanilla"])


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
    for spec in settings.sizes:
        parse_size(spec, settings)


# ---------------------------------------------------------------------------------------------------- budget
def budgets(rungs: Sequence[Rung], scale: float) -> list[float]:
    """Counted training FLOPs of each rung: `scale * f_i**2` (tokens = scale * f_i, f_i the twin's FLOPs/token)."""
    return [scale * rung.flops_per_token["vanilla"] ** 2 for rung in rungs]


def time_scale(
    rungs: Sequence[Rung], settings: LadderSettings, seconds_per_step: dict[tuple[str, str], float], spent: float
) -> float:
    """The largest scale whose runs (all sizes, both archs, every seed) fit the wall-clock budget.

    A run of C FLOPs at f FLOPs/token and t seconds per step of T tokens takes C * t / (f * T) seconds.
    """
    tokens_per_step = settings.batch_size * settings.block_size
    seconds_per_unit = sum(
        settings.seeds
        * rung.flops_per_token["vanilla"] ** 2
        * seconds_per_step[rung.name, arch]
        / (rung.flops_per_token[arch] * tokens_per_step)
        for rung in rungs
        for arch in ARCHS
    )
    runs = len(rungs) * len(ARCHS) * settings.seeds
    left = settings.budget_minutes * 60 * (1 - RESERVE) - spent - runs * RUN_OVERHEAD_SECONDS
    return max(left, 0.0) / seconds_per_unit


def smoke_scale(rungs: Sequence[Rung], settings: LadderSettings) -> float:
    """The scale that gives the smallest rung's twin exactly `smoke_steps` steps."""
    tokens = settings.smoke_steps * settings.batch_size * settings.block_size
    return tokens / rungs[0].flops_per_token["vanilla"]


def learning_rate_of(arch: str, settings: LadderSettings) -> float:
    """Each architecture may train at its own peak learning rate (HiRes prefers a lower one than its twin)."""
    if arch == "hires" and settings.hires_learning_rate is not None:
        return settings.hires_learning_rate
    return settings.learning_rate


def steps_for(budget: float, flops_per_token: float, settings: LadderSettings) -> int:
    return max(1, math.floor(budget / (flops_per_token * settings.batch_size * settings.block_size)))


# ---------------------------------------------------------------------------------------------------- running
class FlopsBar(TrainerCallback):
    """Advances the ladder's one progress bar by the counted FLOPs of every optimizer step."""

    def __init__(self, bar: tqdm, flops_per_step: float) -> None:
        self.bar = bar
        self.step = int(flops_per_step)
        self.done = 0

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.bar.update(self.step)
        self.done += self.step


@dataclass
class LadderData:
    tokenizer: Any
    train: PackedDataset
    validation: PackedDataset


def prepare_data(settings: LadderSettings) -> LadderData:
    """The stdlib corpus, one BPE for every run, packed training and validation blocks."""
    corpus = load_default_corpus(max_chars=settings.max_chars)
    tokenizer = build_tokenizer(corpus.train, settings.vocab_size, sample_chars=settings.tokenizer_sample_chars)
    eos = tokenizer.eos_token_id
    train = PackedDataset(pack(encode_documents(tokenizer, corpus.train), settings.block_size, eos))
    validation = pack(encode_documents(tokenizer, corpus.validation), settings.block_size, eos)
    return LadderData(tokenizer, train, PackedDataset(validation[: settings.eval_blocks]))


def run_ladder(
    settings: LadderSettings,
    out: str | Path,
    progress: bool = True,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Train every (size, seed, arch), write the RUNS file after each run, return its records."""
    started = time.perf_counter()
    out = Path(out)
    check_settings(settings)
    ensure_writable(out.parent if str(out.parent) else Path("."))
    before = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        data = prepare_data(settings)
        rungs = build_rungs(settings, special_token_ids(data.tokenizer))
        scale, timings = plan_scale(rungs, settings, time.perf_counter() - started)
        records = _train_all(rungs, budgets(rungs, scale), timings, settings, data, out, progress, on_run)
    finally:
        torch.set_num_threads(before)
    return records


def plan_scale(
    rungs: Sequence[Rung], settings: LadderSettings, spent: float
) -> tuple[float, dict[tuple[str, str], float]]:
    """The budgets' scale and the seconds per step of every (size, arch): fixed steps for a smoke run (no
    timings), otherwise timed steps of every model turned into the scale that fits the budget."""
    if settings.smoke_steps is not None:
        return smoke_scale(rungs, settings), {}
    timings = {
        (rung.name, arch): time_train_step(rung.config(arch), settings.batch_size, settings.block_size)
        for rung in rungs
        for arch in ARCHS
    }
    scale = time_scale(rungs, settings, timings, spent)
    smallest = steps_for(budgets(rungs, scale)[0], rungs[0].flops_per_token["hires"], settings)
    if smallest < MIN_STEPS:
        raise HiResUserError(
            f"--budget-minutes {settings.budget_minutes:g} leaves {smallest} step(s) for the smallest size "
            f"(at least {MIN_STEPS} needed): raise the budget, use fewer --seeds, or drop the largest size."
        )
    return scale, timings


def _train_all(rungs, rung_budgets, timings, settings, data, out, progress, on_run) -> list[dict[str, Any]]:
    tokens_per_step = settings.batch_size * settings.block_size
    jobs = [
        (rung, budget, seed, arch)
        for seed in range(settings.seeds)
        for rung, budget in zip(rungs, rung_budgets)
        for arch in ARCHS
    ]  # seeds outermost: an interrupted ladder still leaves whole ladders in the RUNS file
    total = sum(
        steps_for(b, r.flops_per_token[a], settings) * int(r.flops_per_token[a] * tokens_per_step)
        for r, b, _, a in jobs
    )
    bar = tqdm(total=total, unit="FLOP", unit_scale=True, desc="ladder", disable=not progress)
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hires-ladder-") as scratch, bar:
        for rung, budget, seed, arch in jobs:
            bar.set_postfix_str(f"{rung.name} {arch} seed {seed}")
            guard = timings.get((rung.name, arch))
            record = train_one(rung, arch, seed, budget, settings, data, Path(scratch), bar, guard)
            records.append(record)
            write_runs(out, records)
            if on_run is not None:
                on_run(record)
    return records


def train_one(
    rung: Rung,
    arch: str,
    seed: int,
    budget: float,
    settings: LadderSettings,
    data: LadderData,
    scratch: Path,
    bar: tqdm,
    step_seconds: float | None = None,
) -> dict[str, Any]:
    """One run at `budget` counted FLOPs; the RUNS record of what it did.

    `step_seconds` (timed before the ladder) bounds the run's wall clock, as a guard against a CPU much busier
    than when it was timed; a run stopped that way records the FLOPs it actually spent."""
    flops_per_token = rung.flops_per_token[arch]
    steps = steps_for(budget, flops_per_token, settings)
    learning_rate = learning_rate_of(arch, settings)
    meter = FlopsBar(bar, flops_per_token * settings.batch_size * settings.block_size)
    with contextlib.redirect_stdout(io.StringIO()):  # with its own bar off the Trainer prints a dict per log
        result = train_model(
            rung.config(arch),
            data.tokenizer,
            data.train,
            data.validation,
            output_dir=scratch / f"{rung.name}-{arch}-{seed}",
            max_steps=steps,
            batch_size=settings.batch_size,
            learning_rate=learning_rate,
            eval_steps=max(1, steps // settings.evaluations),
            logging_steps=max(1, steps // 20),
            seed=seed,
            flops_per_token=flops_per_token,
            max_seconds=3 * steps * step_seconds + 30 if step_seconds else None,
            callbacks=[meter],
            progress=False,
            save_model=False,
        )
    bar.update(max(steps * meter.step - meter.done, 0))  # a run stopped early: keep the bar's total honest
    config = rung.hires
    return {
        "arch": arch,
        "params": result.params,
        "flops": result.flops,
        "loss": result.final_eval_loss,
        "size": rung.name,
        "seed": seed,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "residual_size": config.residual_size if arch == "hires" else config.hidden_size,
        "layers_per_block": config.layers_per_block if arch == "hires" else None,
        "model_type": rung.config(arch).model_type,
        "budget_flops": budget,
        "flops_per_token": flops_per_token,
        "tokens": result.tokens_seen,
        "steps": result.extra.get("steps"),
        "planned_steps": steps,
        "train_seconds": result.train_seconds,
        "tokens_per_second": result.tokens_per_second,
        "block_size": settings.block_size,
        "batch_size": settings.batch_size,
        "learning_rate": learning_rate,
        "vocab_size": settings.vocab_size,
        "eval_blocks": len(data.validation),
        "curve": [[flops, loss] for flops, loss in zip(*result.eval_curve())],
    }


def write_runs(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """The RUNS file, one record a line, through a temporary file (a reader never sees half of it)."""
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text("".join(json.dumps(record) + "\n" for record in records))
    staging.replace(path)


def settings_with(settings: LadderSettings, **changes: Any) -> LadderSettings:
    """A copy with the given fields changed (None leaves a field as it is)."""
    return replace(settings, **{key: value for key, value in changes.items() if value is not None})


__all__ = [
    "LadderSettings",
    "Rung",
    "budgets",
    "build_rungs",
    "parse_size",
    "run_ladder",
    "settings_with",
    "write_runs",
]
