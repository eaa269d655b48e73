"""The one experiment harness: data -> shape -> FLOP budget -> learning-rate sweeps -> comparable runs.

Every comparison the package makes (`hires-hf compare`, the design sweep, the ladder, the stability benchmark)
is a short list of *arms* handed to this module. What it fixes, so that numbers from different commands mean the
same thing:

- one data path (`hires_hf.training.prepare`): a corpus (the embedded stdlib sample, Python sources, or a user's
  jsonl / text files), one byte-level BPE tokenizer, documents packed into blocks, a fixed validation slice;
- one shape -> config rule (`Shape`, built on `hires_hf.configuration_hires.shape_fields`, which the presets use
  too);
- one budget planner (`plan_budget`: counted FLOPs, control tokens, control steps or minutes of the control's
  measured speed): every arm trains for the same counted training FLOPs (`hires_hf.accounting`), so an arm that
  costs more per token takes fewer steps;
- one loop and schedule (`hires_hf.training.loop`): AdamW, transformers' cosine-with-min-lr, the same batches
  in the same order for every arm under one seed, bf16 autocast where bf16 matmuls are native, compiled when
  the run is long enough to repay it;
- one run record (`hires_hf.experiments.runs.Run`): the result with the full spec that made it, stored and
  found by the spec's hash (`RunStore`), checkpointed while it trains;
- one learning-rate rule: each arm gets its own grid (`DEFAULT_RATES`), extended by factors of 2 until its best
  rate has a worse rate on both sides (bracketed), or flagged when the extension limit is reached.

The baseline is the *control*: the Llama twin with its embedding output scaled like HiRes's
(`embedding_multiplier`), the strongest simple vanilla we know. The plain transformers twin is a second row.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedConfig

from ..accounting import train_flops_per_token
from ..configuration_hires import HiResConfig, shape_fields
from ..errors import HiResUserError
from ..training import loop
from ..training.loop import (
    ADAM_BETAS,
    MIN_LR_RATE,
    SCHEDULE,
    WARMUP_FRACTION,
    LoopResult,
    LoopSettings,
    resolve_precision,
    should_compile,
    time_train_step,
    train_loop,
)
from ..training.prepare import Data, prepare_data
from ..training.tokenizer import save_tokenizer
from ..twins import scale_twin_embedding, vanilla_config
from .runs import Run, RunStore, arm_source, code_fingerprint, git_commit, resolved_config, spec_key, versions

HIRES, CONTROL, PLAIN = "hires", "control", "plain"
SPECIAL_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")
FIELDS = set(HiResConfig.__dataclass_fields__) - {"model_type", "transformers_version"}  # a shape's carry-over
DEFAULT_RATES = (2e-3, 4e-3, 8e-3)  # every arm's starting grid (x2 apart), extended until bracketed
LR_STEP = 2.0  # grid spacing (x2) and the step of each extension
MAX_EXTENSIONS = 3  # per side: a best rate still at an edge after these is flagged, not hidden


# ---------------------------------------------------------------------------------------------------- shape
@dataclass(frozen=True)
class Shape:
    """A HiRes shape by its widths and depth; the twin and the control have the same d-wide layers."""

    hidden_size: int = 128
    num_hidden_layers: int = 16
    layers_per_block: int = 4
    residual_ratio: float = 2.0  # D / d
    head_dim: int | None = None  # None: the shape rule's (64 from d = 128 up, 32 below)
    vocab_size: int = 4096
    intermediate_size: int | None = None  # None: the shape rule's ~8d/3
    overrides: tuple[tuple[str, Any], ...] = ()  # further HiResConfig fields (a user's config), applied last

    @classmethod
    def from_config(cls, config: HiResConfig) -> Shape:
        """The shape of a given HiRes config: every field it sets is kept, but for the tokenizer's ids and the
        context, which the data decide."""
        decided_by_data = {*SPECIAL_FIELDS, "max_position_embeddings", "vocab_size"}
        kept = {k: v for k, v in config.to_diff_dict().items() if k not in decided_by_data and k in FIELDS}
        return cls(
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_hidden_layers,
            layers_per_block=config.layers_per_block,
            residual_ratio=config.residual_size / config.hidden_size,
            head_dim=config.head_dim,
            vocab_size=config.vocab_size,
            intermediate_size=config.intermediate_size,
            overrides=tuple(sorted(kept.items())),
        )

    @classmethod
    def parse(cls, text: str, **fields: Any) -> Shape:
        """ "DxL" (e.g. "128x16") -> Shape(hidden_size=128, num_hidden_layers=16, ...): the package's one parser."""
        try:
            width, depth = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise HiResUserError(f"Invalid shape {text!r}: write it as WIDTHxLAYERS, e.g. 128x16.") from None
        if width < 1 or depth < 1:
            raise HiResUserError(f"Invalid shape {text!r}: width and layers must be positive, e.g. 128x16.")
        return cls(hidden_size=width, num_hidden_layers=depth, **fields)

    @property
    def name(self) -> str:
        return f"{self.hidden_size}x{self.num_hidden_layers}"

    def config(self, special: dict[str, int | None], context: int, **fields: Any) -> HiResConfig:
        """The HiRes config of this shape; `fields` override any HiResConfig field (D, k included)."""
        base = shape_fields(
            self.hidden_size,
            self.num_hidden_layers,
            self.layers_per_block,
            self.residual_ratio,
            self.head_dim,
            self.vocab_size,
        )
        if self.intermediate_size:
            base["intermediate_size"] = self.intermediate_size
        base["max_position_embeddings"] = max(2 * context, 256)
        return HiResConfig(**{**base, **dict(self.overrides), **special, **fields})


# ---------------------------------------------------------------------------------------------------- arms
@dataclass(frozen=True)
class Arm:
    """One architecture to train: HiRes with some fields changed, the control, or the plain twin.

    `fields` override HiResConfig fields of the shape's HiRes config; `residual_ratio` (D / d) is accepted too, and
    `outer_norm_only: True` removes the outer PostNorm alone, the write norm and both multipliers kept at the values
    the normed stream derives (`outer_norm=False` would reset them too).
    """

    name: str
    kind: str = HIRES
    fields: dict[str, Any] = field(default_factory=dict)

    def hires_config(self, shape: Shape, data: Data) -> HiResConfig:
        fields = dict(self.fields)
        if "residual_ratio" in fields:
            fields["residual_size"] = round(fields.pop("residual_ratio") * shape.hidden_size)
        if fields.pop("outer_norm_only", False):
            normed = shape.config(data.special, data.context, **fields)
            kept = ("write_norm", "write_multiplier", "embedding_multiplier")
            fields |= {name: getattr(normed, name) for name in kept} | {"outer_norm": False}
        return shape.config(data.special, data.context, **fields)

    def config(self, shape: Shape, data: Data) -> PreTrainedConfig:
        hires = self.hires_config(shape, data)
        return hires if self.kind == HIRES else vanilla_config(hires)

    def flops_per_token(self, shape: Shape, data: Data) -> float:
        """Counted training FLOPs per token: what the budget divides by."""
        return train_flops_per_token(self.config(shape, data), data.context)

    def model(self, shape: Shape, data: Data) -> nn.Module:
        """A fresh model (seed it first); the control gets HiRes's embedding scale in its forward."""
        model = AutoModelForCausalLM.from_config(self.config(shape, data))
        if self.kind == CONTROL:
            scale_twin_embedding(model, control_multiplier(self.hires_config(shape, data)))
        return model


def control_multiplier(config: HiResConfig) -> float:
    """The embedding scale the control gets: HiRes's own default for its outer-normed stream, 1/init range."""
    return 1.0 / config.initializer_range


def baseline_arms(plain: bool = False) -> list[Arm]:
    """The control (the baseline), and the plain transformers twin if asked."""
    arms = [Arm("control", CONTROL)]
    return [*arms, Arm("plain-twin", PLAIN)] if plain else arms


# ---------------------------------------------------------------------------------------------------- budget
@dataclass(frozen=True)
class Budget:
    """Training FLOPs per run (counted), spent in batches of `batch_size` blocks."""

    flops: float
    batch_size: int

    def steps(self, flops_per_token: float, context: int) -> int:
        return int(self.flops // (flops_per_token * self.batch_size * context))


def plan_budget(
    control: Arm,
    shape: Shape,
    data: Data,
    batch_size: int,
    *,
    flops: float | None = None,
    tokens: float | None = None,
    steps: int | None = None,
    minutes: float | None = None,
    runs: float = 1.0,
    device: torch.device | str = "cpu",
    precision: str = "auto",
) -> Budget:
    """The package's one budget planner: counted training FLOPs per run, from exactly one of
    - `flops`: as given;
    - `tokens` / `steps`: what that many tokens / optimizer steps of the control cost;
    - `minutes`: what the control's measured step time buys, the minutes shared over `runs` runs (a caller that
      keeps time back for evaluation or saving counts it as extra runs).
    Every arm is then trained for the same FLOPs: one that costs more per token takes fewer steps."""
    given = {"flops": flops, "tokens": tokens, "steps": steps, "minutes": minutes}
    chosen = [name for name, value in given.items() if value is not None]
    if len(chosen) != 1:
        raise HiResUserError(f"Give exactly one budget (FLOPs, tokens, steps or minutes); got {chosen or 'none'}.")
    value = float(given[chosen[0]])
    if value <= 0:
        raise HiResUserError(f"The budget must be positive; got {chosen[0]}={value:g}.")
    per_token = control.flops_per_token(shape, data)
    tokens_per_step = batch_size * data.context
    if flops is not None:
        total = value
    elif tokens is not None:
        total = value * per_token
    elif steps is not None:
        total = value * tokens_per_step * per_token
    else:
        device = torch.device(device)
        config, precision = control.config(shape, data), resolve_precision(device, precision)
        seconds = time_train_step(config, batch_size, data.context, device, precision=precision)
        total = value * 60 / runs / seconds * tokens_per_step * per_token
    return Budget(flops=total, batch_size=batch_size)


# ---------------------------------------------------------------------------------------------------- runs
def recipe(settings: LoopSettings) -> dict[str, Any]:
    """The loop's settings and the optimiser / schedule constants: the training half of a run's spec."""
    constants = {"adam_betas": ADAM_BETAS, "warmup_fraction": WARMUP_FRACTION, "schedule": SCHEDULE}
    return {**asdict(settings), **constants, "min_lr_rate": MIN_LR_RATE}


def run_spec(
    arm: Arm, shape: Shape, data: Data, budget: Budget, settings: LoopSettings, device: torch.device
) -> dict[str, Any]:
    """Everything that decides a run's result (hires_hf.experiments.runs says why each part is there)."""
    config = arm.config(shape, data)
    return {
        "device": device.type,  # CPU and GPU kernels round differently: a GPU run is a run of its own
        "arm": {"name": arm.name, "kind": arm.kind, "class": type(arm).__name__, "fields": arm.fields},
        "config": resolved_config(config),
        # the control's one departure from its Llama config: the embedding scale it trains with
        "embedding_scale": control_multiplier(arm.hires_config(shape, data)) if arm.kind == CONTROL else None,
        "budget": asdict(budget),
        "recipe": recipe(settings),
        "data": data.spec,
        "code": code_fingerprint(TRAINING_FUNCTIONS, arm.kind == HIRES, arm_source(arm)),
        "versions": versions(),
    }


@dataclass(frozen=True)
class RunPlan:
    """A run about to be trained (or found in a store): what it trains and the key its spec hashes to."""

    arm: Arm
    shape: Shape
    budget: Budget
    settings: LoopSettings
    spec: dict[str, Any]
    key: str


def plan_run(
    arm: Arm,
    lr: float,
    shape: Shape,
    data: Data,
    budget: Budget,
    seed: int = 0,
    device: torch.device | str = "cpu",
    evaluations: int = 8,
    precision: str = "auto",
    compile: str = "auto",
) -> RunPlan:
    """The loop settings and spec of one run: every choice resolved (precision, compile, steps) before training."""
    device = torch.device(device)
    flops_per_token = arm.flops_per_token(shape, data)
    steps = budget.steps(flops_per_token, data.context)
    if steps < 1:
        raise HiResUserError(
            f"The budget ({budget.flops:.3g} FLOPs) is less than one step of {arm.name} "
            f"({flops_per_token * budget.batch_size * data.context:.3g} FLOPs): raise the budget or shrink the batch."
        )
    settings = LoopSettings(
        steps=steps,
        batch_size=budget.batch_size,
        learning_rate=lr,
        evaluations=evaluations,
        seed=seed,
        precision=resolve_precision(device, precision),
        compile=should_compile(budget.flops, device, compile),
    )
    spec = run_spec(arm, shape, data, budget, settings, device)
    return RunPlan(arm, shape, budget, settings, spec, spec_key(spec))


def train_run(
    arm: Arm,
    lr: float,
    shape: Shape,
    data: Data,
    budget: Budget,
    seed: int = 0,
    device: torch.device | str = "cpu",
    evaluations: int = 8,
    precision: str = "auto",
    compile: str = "auto",
    store: RunStore | None = None,
    keep: Callable[[nn.Module], None] | None = None,
    **hooks: Callable[..., None],
) -> Run:
    """Train `arm` at peak `lr` for the budget's FLOPs, or return the stored run of the same spec from `store`
    (which also checkpoints the run while it trains, and resumes it). `keep(model)` sees the trained model (to
    save it; a stored run is trained again when `keep` is given); `hooks` (`on_step`, `before_update`,
    `after_update`) go to the loop."""
    plan = plan_run(arm, lr, shape, data, budget, seed, device, evaluations, precision, compile)
    return execute(plan, data, device, store, keep, **hooks)


def execute(
    plan: RunPlan,
    data: Data,
    device: torch.device | str = "cpu",
    store: RunStore | None = None,
    keep: Callable[[nn.Module], None] | None = None,
    **hooks: Callable[..., None],
) -> Run:
    """Train a planned run (or return it from `store`); the record carries the plan's spec and key."""
    if store is not None and keep is None and (stored := store.get(plan.key)) is not None:
        return stored
    settings, arm = plan.settings, plan.arm
    torch.manual_seed(settings.seed)
    model = arm.model(plan.shape, data).to(device)
    checkpoint = store.checkpoint(plan.key) if store is not None else None
    result: LoopResult = train_loop(model, data.train, data.validation, settings, checkpoint=checkpoint, **hooks)
    if keep is not None:
        keep(model)
    flops_per_token = arm.flops_per_token(plan.shape, data)
    tokens_per_step = settings.batch_size * data.context
    curve = [(step * tokens_per_step * flops_per_token, loss) for step, loss in result.curve]
    run = Run(
        arm.name,
        settings.learning_rate,
        settings.seed,
        result.steps,
        flops_per_token,
        result.final_loss,
        curve,
        result.train_seconds,
        result.tokens_per_second,
        result.diverged,
        key=plan.key,
        spec=plan.spec,
        commit=git_commit(),
    )
    if store is not None:
        store.put(run)
    return run


# The code a run's result depends on beyond what its spec records (`hires_hf.experiments.runs` explains).
TRAINING_FUNCTIONS = (
    loop.train_loop,
    loop.build_optimizer,
    loop.build_scheduler,
    loop.evaluate,
    loop.batch_order,
    loop.autocast,
    loop._evaluation_steps,
    Arm.model,
    control_multiplier,
    scale_twin_embedding,
    execute,
)


def save_model(model: nn.Module, arm: Arm, shape: Shape, data: Data, folder: Path) -> None:
    """A loadable folder; the control's embedding scale is folded into its weights (Llama has no multiplier)."""
    if arm.kind == CONTROL:
        embedding = model.get_input_embeddings()
        embedding._forward_hooks.clear()  # the scale moves from the hook into the weights
        scale = control_multiplier(arm.hires_config(shape, data))
        if model.config.tie_word_embeddings:
            model.config.tie_word_embeddings = False
            model.lm_head.weight = nn.Parameter(embedding.weight.detach().clone())
        embedding.weight.data.mul_(scale)
    model.save_pretrained(folder)
    # the tokenizer's limit is the model's (as `train_model` saves it), not the blocks it trained on
    save_tokenizer(data.tokenizer, folder, model_max_length=model.config.max_position_embeddings)


# ---------------------------------------------------------------------------------------------------- LR grids
def best_run(runs: Sequence[Run]) -> Run:
    """The run with the lowest final validation loss (a diverged run's is infinite)."""
    return min(runs, key=lambda run: run.final_loss)


def best_rate(losses: dict[float, float]) -> float:
    """The rate of the lowest loss in {rate: loss}."""
    return min(losses, key=losses.__getitem__)


def bracket_status(losses: dict[float, float]) -> str:
    """ "bracketed" when the best rate has a tried rate on both sides, else which edge it sits at."""
    rates = sorted(losses)
    best = best_rate(losses)
    if len(rates) == 1:
        return "single rate"
    if best == rates[-1]:
        return "high edge"
    if best == rates[0]:
        return "low edge"
    return "bracketed"


def tidy_rate(lr: float) -> float:
    """A rate rounded to 4 significant digits: the same rate whichever way it was reached (x sqrt(2) twice or x 2)."""
    return float(f"{lr:.4g}")


def next_rate(losses: dict[float, float], step: float = LR_STEP) -> float | None:
    """The rate to try next so that the best is bracketed (x `step` past the edge it sits at); None when it is."""
    status = bracket_status(losses)
    rates = sorted(losses)
    if status == "high edge":
        return tidy_rate(rates[-1] * step)
    if status == "low edge":
        return tidy_rate(rates[0] / step)
    return None


def pending_rates(
    rates: Sequence[float], losses: dict[float, float], step: float = LR_STEP, max_extensions: int = MAX_EXTENSIONS
) -> list[float]:
    """The rates still to train so that the best of `losses` is bracketed: the grid's missing ones that could still
    be the best (`past_a_closed_side`), else the next extension (x `step` past the edge the best sits at), else none
    (bracketed, or `max_extensions` spent)."""
    missing = [lr for lr in rates if not _tried(lr, losses) and not past_a_closed_side(lr, losses)]
    if missing:
        return missing
    extensions = sum(not _tried(lr, rates) for lr in losses)
    rate = next_rate(losses, step) if extensions < max_extensions else None
    return [] if rate is None else [rate]


def past_a_closed_side(rate: float, losses: dict[float, float]) -> bool:
    """Whether a tried rate between the best of `losses` and `rate` is already worse than the best: a rate curve has
    one minimum, so `rate` cannot be the best and training it would only cost a run (a grid centred on a rate that
    stalled at the next rung would otherwise train the rate above it, which is worse still)."""
    if not losses:
        return False
    best = best_rate(losses)
    low, high = sorted((best, rate))
    return any(low < lr < high and loss > losses[best] for lr, loss in losses.items())


def _tried(rate: float, rates: Iterable[float]) -> bool:
    return any(math.isclose(rate, done, rel_tol=1e-9) for done in rates)


def sweep_rates(
    train: Callable[[float], Run],
    rates: Sequence[float],
    done: Sequence[Run] = (),
    max_extensions: int = MAX_EXTENSIONS,
    step: float = LR_STEP,
) -> tuple[list[Run], str]:
    """Train at `rates` in order (skipping those in `done`, and those past a side already closed), then extend by
    x `step` until the best is bracketed or `max_extensions` more rates were tried; returns every run and the final
    bracket status."""
    runs = {run.lr: run for run in done}
    while todo := pending_rates(rates, {lr: run.final_loss for lr, run in runs.items()}, step, max_extensions):
        runs[todo[0]] = train(todo[0])  # one at a time: each result may spare a rate past it
    status = bracket_status({lr: run.final_loss for lr, run in runs.items()})
    return sorted(runs.values(), key=lambda run: run.lr), status


def loss_at_flops(run: Run, flops: float) -> float:
    """Validation loss interpolated (linearly in log-FLOPs) at `flops` along a run's curve."""
    points = [(f, loss) for f, loss in run.curve if f > 0]
    if flops <= points[0][0]:
        return points[0][1]
    for (f0, l0), (f1, l1) in itertools.pairwise(points):
        if flops <= f1:
            t = (math.log(flops) - math.log(f0)) / (math.log(f1) - math.log(f0))
            return l0 + t * (l1 - l0)
    return points[-1][1]


__all__ = [
    "CONTROL",
    "DEFAULT_RATES",
    "HIRES",
    "PLAIN",
    "Arm",
    "Budget",
    "Data",
    "Run",
    "RunPlan",
    "RunStore",
    "Shape",
    "baseline_arms",
    "best_rate",
    "best_run",
    "bracket_status",
    "control_multiplier",
    "execute",
    "loss_at_flops",
    "next_rate",
    "past_a_closed_side",
    "pending_rates",
    "plan_budget",
    "plan_run",
    "prepare_data",
    "run_spec",
    "save_model",
    "sweep_rates",
    "tidy_rate",
    "train_run",
]
