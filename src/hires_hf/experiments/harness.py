"""The one experiment harness: data -> shape -> FLOP budget -> learning-rate sweeps -> comparable runs.

Every comparison the package makes (`hires-hf compare`, the design sweep, the ladder, the stability benchmark)
is a short list of *arms* handed to this module. What it fixes, so that numbers from different commands mean the
same thing:

- one data path: a corpus (the embedded stdlib sample, Python sources, or a user's jsonl / text files), one
  byte-level BPE tokenizer, documents packed into blocks, a fixed validation slice, its unigram cross-entropy;
- one shape -> config rule (`Shape`): heads of `head_dim`, SwiGLU width ~8d/3 rounded up to a multiple of 8;
- one budget: every arm trains for the same counted training FLOPs (`hires_hf.accounting`), so an arm that
  costs more per token takes fewer steps;
- one loop and schedule (`hires_hf.training.loop`): AdamW, transformers' cosine-with-min-lr, the same batches
  in the same order for every arm under one seed;
- one learning-rate rule: each arm gets its own grid, extended by factors of 2 until its best rate has a worse
  rate on both sides (bracketed), or flagged when the extension limit is reached.

The baseline is the *control*: the Llama twin with its embedding output scaled like HiRes's
(`embedding_multiplier`), the strongest simple vanilla we know. The plain transformers twin is a second row.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedConfig, PreTrainedTokenizerBase

from ..accounting import train_flops_per_token
from ..configuration_hires import HiResConfig
from ..errors import HiResUserError
from ..training.data import Corpus, load_default_corpus, load_python_sources, load_text_files, pack
from ..training.loop import LoopResult, LoopSettings, time_train_step, train_loop
from ..training.tokenizer import build_tokenizer, encode_documents, save_tokenizer, special_token_ids
from ..twins import scale_twin_embedding, vanilla_config

HIRES, CONTROL, PLAIN = "hires", "control", "plain"
SPECIAL_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")
FIELDS = set(HiResConfig.__dataclass_fields__) - {"model_type", "transformers_version"}  # a shape's carry-over
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
    head_dim: int = 64
    vocab_size: int = 4096
    intermediate_size: int | None = None  # None: ~8d/3 rounded up to a multiple of 8
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
        """ "DxL" (e.g. "128x16") -> Shape(hidden_size=128, num_hidden_layers=16, ...)."""
        try:
            width, depth = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise HiResUserError(f"Invalid shape {text!r}: write it as WIDTHxLAYERS, e.g. 128x16.") from None
        return cls(hidden_size=width, num_hidden_layers=depth, **fields)

    @property
    def name(self) -> str:
        return f"{self.hidden_size}x{self.num_hidden_layers}"

    def config(self, special: dict[str, int | None], context: int, **fields: Any) -> HiResConfig:
        """The HiRes config of this shape; `fields` override any HiResConfig field (D, k included)."""
        d = self.hidden_size
        head_dim = min(self.head_dim, d)
        base = dict(
            vocab_size=self.vocab_size,
            hidden_size=d,
            intermediate_size=self.intermediate_size or math.ceil(8 * d / 3 / 8) * 8,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=max(1, d // head_dim),
            head_dim=head_dim,
            max_position_embeddings=max(2 * context, 256),
            residual_size=round(self.residual_ratio * d),
            layers_per_block=self.layers_per_block,
        )
        return HiResConfig(**{**base, **dict(self.overrides), **special, **fields})


# ---------------------------------------------------------------------------------------------------- data
@dataclass
class Data:
    """Packed train / validation blocks of one corpus under one tokenizer."""

    train: torch.Tensor
    validation: torch.Tensor
    tokenizer: PreTrainedTokenizerBase
    unigram_loss: float
    source: str

    @property
    def special(self) -> dict[str, int | None]:
        return special_token_ids(self.tokenizer)

    @property
    def context(self) -> int:
        return self.train.shape[1]


def load_corpus(source: str | Path | Sequence[str | Path], max_chars: int | None, validation_fraction: float) -> Corpus:
    """ "stdlib" (embedded sample), "python" (this machine's Python sources), or files / folders of text / jsonl."""
    if source == "stdlib":
        return load_default_corpus(validation_fraction=validation_fraction, max_chars=max_chars)
    if source == "python":
        return load_python_sources(validation_fraction=validation_fraction, max_chars=max_chars)
    paths = [source] if isinstance(source, str | Path) else list(source)
    return load_text_files(paths, validation_fraction=validation_fraction, max_chars=max_chars)


def prepare_data(
    source: str | Path | Sequence[str | Path],
    vocab_size: int,
    context: int,
    max_chars: int | None = 12_000_000,
    validation_fraction: float = 0.01,
    eval_blocks: int = 64,
    progress: bool = True,
) -> Data:
    """One corpus, one tokenizer trained on its training split, packed blocks, a fixed validation slice."""
    corpus = load_corpus(source, max_chars, validation_fraction)
    tokenizer = build_tokenizer(corpus.train, vocab_size=vocab_size, sample_chars=2_000_000)
    train, validation = pack_splits(corpus, tokenizer, context, eval_blocks, progress)
    if len(train) == 0 or len(validation) == 0:
        raise HiResUserError(
            f"Too little text in {source}: {len(train)} training and {len(validation)} validation blocks of "
            f"{context} tokens; give more text or a shorter --context."
        )
    return Data(train, validation, tokenizer, unigram_loss(train, validation), str(source))


def pack_splits(
    corpus: Corpus, tokenizer: PreTrainedTokenizerBase, context: int, eval_blocks: int | None, progress: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) blocks of `context` tokens, documents separated by eos; validation cut to its first
    `eval_blocks` (None: all). The one packing rule: `hires-hf train` uses it with its own corpus and tokenizer."""
    eos = tokenizer.eos_token_id
    train = pack(encode_documents(tokenizer, corpus.train, progress=progress), context, eos)
    validation = pack(encode_documents(tokenizer, corpus.validation, progress=progress), context, eos)
    return train, validation[:eval_blocks]


def unigram_loss(train: torch.Tensor, validation: torch.Tensor) -> float:
    """Cross-entropy (nats/token) of the validation tokens under the training tokens' add-one unigram
    distribution: what a model that ignores its input reaches (the plateau a stalled run sits on)."""
    counts = Counter(train.flatten().tolist())
    vocab = max(int(train.max()), int(validation.max())) + 1
    total = sum(counts.values()) + vocab
    targets = validation[:, 1:].flatten().tolist()  # the model is scored from the second token on
    return -sum(math.log((counts.get(t, 0) + 1) / total) for t in targets) / len(targets)


# ---------------------------------------------------------------------------------------------------- arms
@dataclass(frozen=True)
class Arm:
    """One architecture to train: HiRes with some fields changed, the control, or the plain twin.

    `fields` override HiResConfig fields of the shape's HiRes config; `residual_ratio` (D / d) is accepted too.
    """

    name: str
    kind: str = HIRES
    fields: dict[str, Any] = field(default_factory=dict)

    def hires_config(self, shape: Shape, data: Data) -> HiResConfig:
        fields = dict(self.fields)
        if "residual_ratio" in fields:
            fields["residual_size"] = round(fields.pop("residual_ratio") * shape.hidden_size)
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


def timed_budget(
    control: Arm, shape: Shape, data: Data, batch_size: int, seconds: float, runs: int, device: torch.device
) -> Budget:
    """The FLOPs per run that buy `runs` runs in `seconds`, at the control's measured step time (every arm is
    counted at the control's seconds per FLOP: the budget is the baseline's)."""
    step_seconds = time_train_step(control.config(shape, data), batch_size, data.context, device)
    step_flops = control.flops_per_token(shape, data) * batch_size * data.context
    return Budget(flops=seconds / runs / step_seconds * step_flops, batch_size=batch_size)


# ---------------------------------------------------------------------------------------------------- runs
@dataclass
class Run:
    """One trained arm at one peak learning rate and seed."""

    arm: str
    lr: float
    seed: int
    steps: int
    flops_per_token: float
    final_loss: float
    curve: list[tuple[float, float]]  # (counted training FLOPs, validation loss)
    seconds: float
    tokens_per_second: float
    diverged: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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
    keep: Callable[[nn.Module], None] | None = None,
    **hooks: Callable[..., None],
) -> Run:
    """Train `arm` at peak `lr` for the budget's FLOPs; `keep(model)` sees the trained model (to save it);
    `hooks` (`on_step`, `before_update`, `after_update`) go to the loop: a progress bar, diagnostics."""
    flops_per_token = arm.flops_per_token(shape, data)
    steps = budget.steps(flops_per_token, data.context)
    if steps < 1:
        raise HiResUserError(
            f"The budget ({budget.flops:.3g} FLOPs) is less than one step of {arm.name} "
            f"({flops_per_token * budget.batch_size * data.context:.3g} FLOPs): raise the budget or shrink the batch."
        )
    torch.manual_seed(seed)
    model = arm.model(shape, data).to(device)
    settings = LoopSettings(
        steps=steps,
        batch_size=budget.batch_size,
        learning_rate=lr,
        evaluations=evaluations,
        seed=seed,
        precision=precision,
    )
    result: LoopResult = train_loop(model, data.train, data.validation, settings, **hooks)
    if keep is not None:
        keep(model)
    tokens_per_step = budget.batch_size * data.context
    curve = [(step * tokens_per_step * flops_per_token, loss) for step, loss in result.curve]
    return Run(
        arm.name,
        lr,
        seed,
        result.steps,
        flops_per_token,
        result.final_loss,
        curve,
        result.train_seconds,
        result.tokens_per_second,
        result.diverged,
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


def bracket_status(losses: dict[float, float]) -> str:
    """ "bracketed" when the best rate has a tried rate on both sides, else which edge it sits at."""
    rates = sorted(losses)
    best = min(rates, key=lambda lr: losses[lr])
    if len(rates) == 1:
        return "single rate"
    if best == rates[-1]:
        return "high edge"
    if best == rates[0]:
        return "low edge"
    return "bracketed"


def next_rate(losses: dict[float, float]) -> float | None:
    """The rate to try next so that the best is bracketed (x2 past the edge it sits at); None when it is."""
    status = bracket_status(losses)
    rates = sorted(losses)
    if status == "high edge":
        return rates[-1] * LR_STEP
    if status == "low edge":
        return rates[0] / LR_STEP
    return None


def sweep_rates(
    train: Callable[[float], Run],
    rates: Sequence[float],
    done: Sequence[Run] = (),
    max_extensions: int = MAX_EXTENSIONS,
) -> tuple[list[Run], str]:
    """Train at each of `rates` (skipping those in `done`), then extend by x2 until the best is bracketed or
    `max_extensions` more rates were tried; returns every run and the final bracket status."""
    runs = {run.lr: run for run in done}
    for lr in rates:
        if lr not in runs:
            runs[lr] = train(lr)
    for _ in range(max_extensions):
        rate = next_rate({lr: run.final_loss for lr, run in runs.items()})
        if rate is None:
            break
        runs[rate] = train(rate)
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
    "HIRES",
    "PLAIN",
    "Arm",
    "Budget",
    "Data",
    "Run",
    "Shape",
    "baseline_arms",
    "best_run",
    "bracket_status",
    "control_multiplier",
    "load_corpus",
    "loss_at_flops",
    "next_rate",
    "pack_splits",
    "prepare_data",
    "save_model",
    "sweep_rates",
    "timed_budget",
    "train_run",
    "unigram_loss",
]
