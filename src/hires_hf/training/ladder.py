"""The scaling ladder: HiRes and its vanilla twin trained at several sizes, each pair at equal counted FLOPs.

What `hires-hf scaling` needs to fit `L(C) = A * C**-alpha` per architecture is a set of (counted training
FLOPs, final validation loss) points. The ladder makes them:

- one byte-level BPE trained once and shared by every run (a loss is only comparable under one tokenizer);
- each size (a rung) gets one FLOPs budget `C_i`, spent by HiRes and by its vanilla twin alike: HiRes pays
  for its read / write projections with fewer tokens (compute, not parameters: docs/architecture.md);
- budgets grow as the square of the twin's FLOPs per token, so tokens grow in proportion to model cost
  (a fixed tokens-per-parameter ratio, the shape of a compute-optimal frontier); the common scale is chosen
  from synchronised timed steps of every model on the training device, so that the ladder fits its
  wall-clock budget;
- each architecture at its own learning rate: given `lr_sweep`, both are swept at the smallest rung and each
  one's best rate is carried up the ladder by the width rule `lr(d) = lr_best * d_0 / d` (the standard
  parametrisation's 1/width scaling of Adam's hidden-layer rate), which one more rung checks against the
  unscaled rate (records with `role` "rule-check");
- every (size, seed) pair sees the same batches in the same order; seeds give the spread;
- optionally one MoE point (`moe_size`): an OLMoE-shaped HiRes-MoE and its OLMoE twin, same protocol.

Training is `hires_hf.training.loop` (the package's recipe, data kept on the device, bf16 autocast on CUDA).
The RUNS file (JSONL, rewritten atomically after every run) holds one record per run with the fields
`hires_hf.eval.scaling.read_runs` reads (`arch`, `params`, `flops`, `loss`) plus the rung, seed, role, learning
rate, tokens, timings and the validation curve (`curve`: [[flops, loss], ...]); only `role` "ladder" records
enter the fits.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, PreTrainedConfig

from ..accounting import train_flops_per_token
from ..configuration_hires import PRESETS, HiResConfig
from ..errors import HiResUserError
from ..io import write_text_atomic
from ..twins import scale_twin_embedding, vanilla_config
from .data import PackedDataset, load_default_corpus, load_python_sources, pack
from .loop import LoopSettings, pick_device, time_train_step, train_loop
from .tokenizer import build_tokenizer, encode_documents, special_token_ids
from .trainer import ensure_writable

ARCHS = ("hires", "vanilla")
RESERVE = 0.30  # share of the budget kept for data, evaluation, model building and a busy shared CPU
CUDA_RESERVE = 0.10  # a GPU's synchronised timings hold: keep less back
RUN_OVERHEAD_SECONDS = 3.0  # per run: building the model, the evaluations
MIN_STEPS = 20  # fewer optimizer steps than this on the smallest rung says nothing about the architecture
SIZE_PATTERN = re.compile(r"^(\d+)x(\d+)$")
ROLES = ("sweep", "ladder", "rule-check", "moe")


@dataclass(frozen=True)
class LadderSettings:
    """One ladder; `smoke()` is the seconds-long version tests use, `gpu()` the one-H200 preset.

    `sizes`: "DxL" (compute width d and depth L; D = width_factor * d, k = layers_per_block, heads of `head_dim`
    dims, SwiGLU width ~8d/3) or a preset name (taken as it is but for the vocabulary, which the shared
    tokenizer sets). The CPU defaults are the `ladder-1..4` presets at half their width.
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
    learning_rate: float = 2e-3
    hires_learning_rate: float | None = None  # None: HiRes trains at `learning_rate` too
    scaled_twin: bool = False  # the twin's embeddings x 1/initializer_range, as HiRes's (a control; twins.py)
    lr_sweep: tuple[float, ...] = ()  # peak rates swept at the smallest rung; the width rule carries the best up
    seeded_rungs: int | None = None  # only the smallest this many rungs get every seed (None: all rungs)
    moe_size: str | None = None  # "DxL" of one MoE point (HiRes-MoE and its OLMoE twin), or None
    corpus: str = "stdlib"  # "stdlib" or "python" (the stdlib and site-packages)
    max_chars: int | None = 8_000_000
    tokenizer_sample_chars: int = 1_000_000
    eval_blocks: int = 64
    evaluations: int = 8
    smoke_steps: int | None = None  # vanilla steps on the smallest rung instead of a timed budget
    threads: int = 1
    device: str = "auto"

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
            device="cpu",
        )
        return cls(**{**fields, **overrides})

    @classmethod
    def gpu(cls, **overrides: Any) -> LadderSettings:
        """Four rungs from ~6M to ~110M non-embedding parameters for one H200 in ~9 minutes (bf16, no compile):
        heads of 64, D = 2d, k = 4, context 1024, batches of 32 blocks, a 3-rate sweep at the smallest rung,
        2 seeds at the two smallest rungs, one MoE point; data: this interpreter's Python sources."""
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
            tokenizer_sample_chars=4_000_000,
            eval_blocks=64,
            evaluations=6,
            threads=8,
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


@dataclass(frozen=True)
class Job:
    """One run: a rung, an architecture, a seed, why it runs (`role`) and its peak rate (None: after the sweep)."""

    rung: Rung
    arch: str
    seed: int
    role: str
    learning_rate: float | None


# ---------------------------------------------------------------------------------------------------- sizes
def parse_size(
    spec: str, settings: LadderSettings, tokens: dict[str, int | None] | None = None, moe: bool = False
) -> HiResConfig:
    """A rung's HiRes config from "DxL" or a preset name; `tokens` are the tokenizer's special token ids.

    `moe`: OLMoE-shaped layers instead of dense SwiGLU (32 experts, top 4, experts d/2 wide, full q/k norm,
    load-balancing and z losses), so that the twin is transformers' OLMoE."""
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
        head = settings.head_dim
        if d % head or d == 0:
            raise HiResUserError(f"--sizes {spec!r}: the width must be a positive multiple of {head} (head size).")
        if layers % settings.layers_per_block or layers == 0:
            raise HiResUserError(
                f"--sizes {spec!r}: {layers} layers do not split into blocks of {settings.layers_per_block} "
                "(--layers-per-block); pick L a multiple of k."
            )
        experts = (
            dict(
                num_experts=32,
                num_experts_per_tok=4,
                moe_intermediate_size=d // 2,
                qk_norm="full",
                router_z_loss_coef=0.001,
                output_router_logits=True,
            )
            if moe
            else {}
        )
        return HiResConfig(
            **common,
            hidden_size=d,
            intermediate_size=math.ceil(8 * d / 3 / 8) * 8,  # SwiGLU ~8d/3, a multiple of 8
            num_hidden_layers=layers,
            num_attention_heads=d // head,
            num_key_value_heads=d // head,
            max_position_embeddings=max(256, settings.block_size),
            residual_size=settings.width_factor * d,
            layers_per_block=settings.layers_per_block,
            **experts,
        )
    except (ValueError, StrictDataclassError) as error:  # the config's validation names the field and what is allowed
        raise HiResUserError(f"--sizes {spec!r}: {error.__cause__ or error}") from error


def make_rung(spec: str, settings: LadderSettings, tokens: dict[str, int | None] | None, moe: bool = False) -> Rung:
    hires = parse_size(spec, settings, tokens, moe=moe)
    twin = vanilla_config(hires)
    flops = {arch: train_flops_per_token(config, settings.block_size) for arch, config in zip(ARCHS, (hires, twin))}
    return Rung(f"{spec}-moe" if moe else spec, hires, twin, flops)


def build_rungs(settings: LadderSettings, tokens: dict[str, int | None] | None = None) -> list[Rung]:
    """Every size as a (HiRes, twin) pair, smallest FLOPs per token first."""
    check_settings(settings)
    rungs = [make_rung(spec, settings, tokens) for spec in settings.sizes]
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
    """Every run in the order it trains: sweep, then seed 0 up the ladder, extra seeds, the MoE point, the check
    of the width rule. An interrupted ladder still leaves whole seed-0 ladders in the RUNS file."""
    if not settings.lr_sweep:
        return [
            Job(rung, arch, seed, "ladder", learning_rate_of(arch, settings))
            for seed in range(settings.seeds)
            for rung in rungs
            for arch in ARCHS
        ]
    seeded = len(rungs) if settings.seeded_rungs is None else settings.seeded_rungs
    jobs = [Job(rungs[0], arch, 0, "sweep", rate) for rate in settings.lr_sweep for arch in ARCHS]
    jobs += [Job(rung, arch, 0, "ladder", None) for rung in rungs[1:] for arch in ARCHS]
    jobs += [
        Job(rung, arch, seed, "ladder", None)
        for seed in range(1, settings.seeds)
        for rung in rungs[:seeded]
        for arch in ARCHS
    ]
    if moe_rung is not None:
        jobs += [Job(moe_rung, arch, 0, "moe", None) for arch in ARCHS]
    jobs += [Job(rungs[1], arch, 0, "rule-check", None) for arch in ARCHS]
    return jobs


def width_rule(best: float, base_width: int, width: int) -> float:
    """The peak rate at `width` from the best at `base_width`: Adam's hidden-layer rate scales as 1/width."""
    return best * base_width / width


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
    """The largest scale whose runs all fit the wall-clock budget.

    A run of C FLOPs at f FLOPs/token and t seconds per step of T tokens takes C * t / (f * T) seconds.
    """
    tokens_per_step = settings.batch_size * settings.block_size
    seconds_per_unit = sum(
        job.rung.flops_per_token["vanilla"] ** 2
        * seconds_per_step[job.rung.name, job.arch]
        / (job.rung.flops_per_token[job.arch] * tokens_per_step)
        for job in jobs
    )
    left = settings.budget_minutes * 60 * (1 - reserve) - spent - len(jobs) * RUN_OVERHEAD_SECONDS
    return max(left, 0.0) / seconds_per_unit


def smoke_scale(rungs: Sequence[Rung], settings: LadderSettings) -> float:
    """The scale that gives the smallest rung's twin exactly `smoke_steps` steps."""
    tokens = settings.smoke_steps * settings.batch_size * settings.block_size
    return tokens / rungs[0].flops_per_token["vanilla"]


def learning_rate_of(arch: str, settings: LadderSettings) -> float:
    """Without a sweep each architecture trains at its given peak rate (`--lr`, `--hires-lr`)."""
    if arch == "hires" and settings.hires_learning_rate is not None:
        return settings.hires_learning_rate
    return settings.learning_rate


def steps_for(budget: float, flops_per_token: float, settings: LadderSettings) -> int:
    return max(1, math.floor(budget / (flops_per_token * settings.batch_size * settings.block_size)))


# ---------------------------------------------------------------------------------------------------- data
@dataclass
class LadderData:
    tokenizer: Any
    train: torch.Tensor  # (blocks, block_size) token ids
    validation: torch.Tensor


def prepare_data(settings: LadderSettings) -> LadderData:
    """The corpus, one BPE for every run, packed training and validation blocks (tokenized once)."""
    loader = load_python_sources if settings.corpus == "python" else load_default_corpus
    corpus = loader(max_chars=settings.max_chars)
    tokenizer = build_tokenizer(corpus.train, settings.vocab_size, sample_chars=settings.tokenizer_sample_chars)
    eos = tokenizer.eos_token_id
    train = PackedDataset(pack(encode_documents(tokenizer, corpus.train), settings.block_size, eos)).blocks
    validation = PackedDataset(pack(encode_documents(tokenizer, corpus.validation), settings.block_size, eos)).blocks
    return LadderData(tokenizer, train, validation[: settings.eval_blocks])


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
        data = prepare_data(settings)
        tokens = special_token_ids(data.tokenizer)
        rungs = build_rungs(settings, tokens)
        moe_rung = make_rung(settings.moe_size, settings, tokens, moe=True) if settings.moe_size else None
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
    run (no timings), otherwise timed steps of every model turned into the scale that fits the budget."""
    if settings.smoke_steps is not None:
        return smoke_scale(rungs, settings), {}
    models = {(job.rung.name, job.arch): job.rung.config(job.arch) for job in jobs}
    timings = {
        key: time_train_step(config, settings.batch_size, settings.block_size, device)
        for key, config in tqdm(models.items(), desc="timing steps", leave=False, disable=not progress)
    }
    spent += sum(timings.values()) * 4  # each timing ran a warm-up step and three timed ones
    scale = time_scale(jobs, settings, timings, spent, CUDA_RESERVE if device.type == "cuda" else RESERVE)
    smallest = steps_for(budget_of(rungs[0], scale), rungs[0].flops_per_token["hires"], settings)
    if smallest < MIN_STEPS:
        raise HiResUserError(
            f"--budget-minutes {settings.budget_minutes:g} leaves {smallest} step(s) for the smallest size "
            f"(at least {MIN_STEPS} needed): raise the budget, use fewer --seeds, or drop the largest size."
        )
    return scale, timings


def _train_all(jobs, scale, timings, settings, data, device, out, progress, on_run) -> list[dict[str, Any]]:
    tokens_per_step = settings.batch_size * settings.block_size

    def job_flops(job: Job) -> int:
        per_step = int(job.rung.flops_per_token[job.arch] * tokens_per_step)
        return steps_for(budget_of(job.rung, scale), job.rung.flops_per_token[job.arch], settings) * per_step

    bar = tqdm(total=sum(map(job_flops, jobs)), unit="FLOP", unit_scale=True, desc="ladder", disable=not progress)
    records: list[dict[str, Any]] = []
    with bar:
        for job in jobs:
            rate = job.learning_rate or _carried_rate(job, records, settings)
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
    return records


def best_rates(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each architecture's best swept peak rate (lowest final validation loss, diverged runs excluded)."""
    best: dict[str, tuple[float, float]] = {}
    for record in records:
        if record["role"] == "sweep" and math.isfinite(record["loss"]):
            if record["arch"] not in best or record["loss"] < best[record["arch"]][0]:
                best[record["arch"]] = (record["loss"], record["learning_rate"])
    return {arch: rate for arch, (_, rate) in best.items()}


def _carried_rate(job: Job, records: Sequence[dict[str, Any]], settings: LadderSettings) -> float:
    """A run after the sweep: the architecture's best swept rate, moved to the rung's width by the width rule
    (the rule check runs at the unscaled rate instead)."""
    best = best_rates(records).get(job.arch, settings.lr_sweep[0])
    base = min((r["hidden_size"] for r in records if r["role"] == "sweep"), default=job.rung.hires.hidden_size)
    if job.role == "rule-check":
        return best
    return width_rule(best, base, job.rung.hires.hidden_size)


def train_one(
    job: Job,
    learning_rate: float,
    budget: float,
    settings: LadderSettings,
    data: LadderData,
    device: torch.device,
    bar: tqdm,
    step_seconds: float | None = None,
) -> dict[str, Any]:
    """One run at `budget` counted FLOPs; the RUNS record of what it did.

    A sweep run at the smallest rung with seed 0 is also that rung's ladder point when its rate wins; the
    record says so (`role` stays "sweep", `fit` says whether it is one of the fitted points)."""
    rung, arch = job.rung, job.arch
    flops_per_token = rung.flops_per_token[arch]
    steps = steps_for(budget, flops_per_token, settings)
    torch.manual_seed(job.seed)
    model = AutoModelForCausalLM.from_config(rung.config(arch)).to(device)
    twin_multiplier = 1 / rung.hires.initializer_range if settings.scaled_twin and arch == "vanilla" else None
    if twin_multiplier:
        scale_twin_embedding(model, twin_multiplier)
    params = sum(p.numel() for p in model.parameters())
    loop = LoopSettings(
        steps=steps,
        batch_size=settings.batch_size,
        learning_rate=learning_rate,
        evaluations=settings.evaluations,
        seed=job.seed,
    )
    per_step = int(flops_per_token * settings.batch_size * settings.block_size)
    result = train_loop(model, data.train, data.validation, loop, on_step=lambda _: bar.update(per_step))
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    config = rung.hires
    tokens_per_step = settings.batch_size * settings.block_size
    return {
        "arch": arch,
        "params": params,
        "flops": result.steps * tokens_per_step * flops_per_token,
        "loss": result.final_loss,
        "size": rung.name,
        "seed": job.seed,
        "role": job.role,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "residual_size": config.residual_size if arch == "hires" else config.hidden_size,
        "layers_per_block": config.layers_per_block if arch == "hires" else None,
        "num_experts": config.num_experts,
        "model_type": rung.config(arch).model_type,
        "twin_embedding_multiplier": twin_multiplier,
        "budget_flops": budget,
        "flops_per_token": flops_per_token,
        "tokens": result.tokens,
        "steps": result.steps,
        "planned_steps": steps,
        "diverged": result.diverged,
        "train_seconds": result.train_seconds,
        "planned_seconds": steps * step_seconds if step_seconds else None,
        "tokens_per_second": result.tokens_per_second,
        "block_size": settings.block_size,
        "batch_size": settings.batch_size,
        "learning_rate": learning_rate,
        "vocab_size": settings.vocab_size,
        "eval_blocks": int(data.validation.shape[0]),
        "device": str(device),
        "dtype": "bf16-autocast" if device.type == "cuda" else "fp32",
        "curve": [[step * tokens_per_step * flops_per_token, loss] for step, loss in result.curve],
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
    losers, the rule check, the MoE point or a failed run."""
    best = best_rates(records)
    write_text_atomic(path, "".join(json.dumps({**r, "fit": _is_fitted(r, best)}) + "\n" for r in records))


def settings_with(settings: LadderSettings, **changes: Any) -> LadderSettings:
    """A copy with the given fields changed (None leaves a field as it is)."""
    return replace(settings, **{key: value for key, value in changes.items() if value is not None})


__all__ = [
    "Job",
    "LadderSettings",
    "Rung",
    "best_rates",
    "budgets",
    "build_rungs",
    "make_rung",
    "parse_size",
    "plan_jobs",
    "run_ladder",
    "settings_with",
    "time_scale",
    "width_rule",
    "write_runs",
]
