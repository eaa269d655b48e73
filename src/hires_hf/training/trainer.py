"""HF Trainer wiring for HiRes (and its vanilla twins): one call from a model + packed data to a trained folder.

What this adds to a plain `Trainer`:
- counted training FLOPs (hires_hf.accounting) next to every logged loss, so runs compare on compute;
- MoE router losses (load-balancing `aux_loss`, `z_loss`) logged on their own, and validation loss that is the
  language-model loss alone (comparable between dense, MoE and vanilla models);
- an optional wall-clock budget, agreed by all ranks;
- multi-process: DDP under `torchrun` (gloo on CPU), or transformers' native engine, which shards the model while
  loading it (`DistributedConfig`): FSDP2, tensor parallelism, expert parallelism (docs/distributed.md).
  Evaluation before training goes through `eval_on_start`, never an `evaluate()` call before `train()`, which
  would leave multi-process ranks unwrapped and diverging.
- the final model (with its tokenizer) written to `<output_dir>/model` via a temporary folder.
"""

from __future__ import annotations

import inspect
import math
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.utils.data import Dataset
from transformers import (
    AutoModelForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProgressCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from transformers.distributed import DistributedConfig
from transformers.trainer_utils import get_last_checkpoint

from ..accounting import train_flops_per_token
from ..errors import HiResUserError
from ..io import ensure_writable, staged_folder, write_json_atomic
from ..twins import num_experts
from .loop import ADAM_BETAS, MAX_GRAD_NORM, MIN_LR_RATE, SCHEDULE, WEIGHT_DECAY, warmup_steps
from .tokenizer import check_vocab, save_tokenizer

ROUTER_LOSSES = ("aux_loss", "z_loss")

# transformers 5.24 renamed TrainingArguments' gradient_checkpointing to activation_checkpointing (5.16-5.23 know the
# old name), and is the first whose DistributedConfig takes ep_size (what sharded runs here are tested on).
CHECKPOINTING_ARG = (
    "activation_checkpointing"
    if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
    else "gradient_checkpointing"
)
SHARDING_READY = "ep_size" in inspect.signature(DistributedConfig).parameters


@dataclass
class TrainResult:
    """What a run produced. `history` rows: step, tokens, flops (counted, training) and the losses logged there."""

    final_eval_loss: float
    history: list[dict[str, float]]
    tokens_seen: int
    flops: float
    flops_per_token: float
    params: int
    train_seconds: float
    tokens_per_second: float
    model_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    model: PreTrainedModel | None = field(default=None, repr=False, compare=False)  # the trained model, in memory

    def eval_curve(self) -> tuple[list[float], list[float]]:
        """(counted training FLOPs, validation loss) at each evaluation."""
        rows = [row for row in self.history if "eval_loss" in row]
        return [row["flops"] for row in rows], [row["eval_loss"] for row in rows]

    def to_json(self) -> dict[str, Any]:
        fields = {name: value for name, value in vars(self).items() if name != "model"}
        return {**fields, "model_dir": str(self.model_dir) if self.model_dir else None}


# ---------------------------------------------------------------------------------------------------- callbacks
class HistoryCallback(TrainerCallback):
    """Keeps every log row with the tokens and counted FLOPs seen at its step."""

    def __init__(self, tokens_per_step: int, flops_per_token: float) -> None:
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.rows: list[dict[str, float]] = []

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        tokens = state.global_step * self.tokens_per_step
        row = {"step": state.global_step, "tokens": tokens, "flops": tokens * self.flops_per_token}
        row.update({key: float(value) for key, value in (logs or {}).items() if isinstance(value, (int, float))})
        self.rows.append(row)


class LossBarCallback(ProgressCallback):
    """Trainer's progress bar, with the latest losses as its postfix instead of a printed dict per log, and no
    bar of its own for each evaluation: those nest under the training bar, and outside a terminal every one of
    them leaves a line of cursor-up escape codes in the log; `eval_loss` in the postfix says what they would."""

    SHOWN = ("loss", "eval_loss", *ROUTER_LOSSES)

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs) -> None:
        pass

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if state.is_world_process_zero and self.training_bar is not None:
            self.postfix = {**getattr(self, "postfix", {}), **{k: f"{logs[k]:.4g}" for k in self.SHOWN if k in logs}}
            self.training_bar.set_postfix(self.postfix, refresh=False)


class StopCallback(TrainerCallback):
    """Ends training at `max_seconds` of wall clock (all ranks together) and always evaluates the last step."""

    def __init__(self, max_seconds: float | None) -> None:
        self.max_seconds = max_seconds
        self.start = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if self.max_seconds is not None and _any_rank(time.perf_counter() - self.start > self.max_seconds):
            control.should_training_stop = True
        if control.should_training_stop or state.global_step >= state.max_steps:
            control.should_evaluate = True


def _any_rank(flag: bool) -> bool:
    """True on every rank when it is true on one: ranks must stop at the same step or they deadlock."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag
    value = torch.tensor([float(flag)])
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


# ---------------------------------------------------------------------------------------------------- trainer
class HiResTrainer(Trainer):
    """A Trainer that logs MoE router losses separately and evaluates the language-model loss alone."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.is_moe = num_experts(self.model.config) > 0
        self.router_sums = dict.fromkeys(ROUTER_LOSSES, 0.0)
        self.router_count = 0
        self.eval_seconds = 0.0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.is_moe and model.training:
            inputs = {**inputs, "output_router_logits": True}  # adds coef * (aux, z) to the training loss
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training and self.is_moe:
            for name in ROUTER_LOSSES:
                value = outputs.get(name) if isinstance(outputs, dict) else getattr(outputs, name, None)
                if value is not None:
                    self.router_sums[name] += float(value.detach())
            self.router_count += 1
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs and self.router_count:
            for name, total in self.router_sums.items():
                if total:
                    logs[name] = round(total / self.router_count, 6)
            self.router_sums = dict.fromkeys(ROUTER_LOSSES, 0.0)
            self.router_count = 0
        super().log(logs, *args, **kwargs)

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        start = time.perf_counter()
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self.eval_seconds += time.perf_counter() - start


# ---------------------------------------------------------------------------------------------------- entry point
@dataclass(frozen=True)
class TrainSettings:
    """How one run trains, in one value that callers build once and pass around (the demo and the ladder keep
    their own sizes in settings dataclasses the same way).

    `max_steps` optimizer steps, or fewer if `max_seconds` of wall clock run out. Left as None: `warmup_steps` is
    5% of the steps, `eval_steps` gives ~10 evaluations and `logging_steps` ~50 log rows per run, and
    `flops_per_token` is counted from the model's config. `save_steps=0` writes no checkpoints (`resume` needs
    them). Under torchrun, several processes run DDP unless the model is sharded while loading:
    `fsdp_size` > 1 with FSDP2, `tp_size` > 1 with tensor parallelism (alone, or with FSDP2 over the other
    processes: world = fsdp_size x tp_size), `ep_size` > 1 with expert parallelism (MoE; dividing
    fsdp_size x tp_size). The model and its tokenizer are saved to `<output_dir>/model` unless `save_model=False`.
    """

    max_steps: int
    batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-3
    warmup_steps: int | None = None
    weight_decay: float = WEIGHT_DECAY
    eval_steps: int | None = None
    logging_steps: int | None = None
    save_steps: int = 0
    seed: int = 0
    resume: bool = False
    max_seconds: float | None = None
    flops_per_token: float | None = None
    bf16: bool = False
    tf32: bool = False
    activation_checkpointing: bool = False
    fsdp_size: int | None = None
    tp_size: int | None = None
    ep_size: int | None = None
    progress: bool = True
    save_model: bool = True

    @property
    def fsdp(self) -> bool:
        """Shard with FSDP2 (more than one shard asked for)."""
        return bool(self.fsdp_size and self.fsdp_size > 1)

    @property
    def sharded(self) -> bool:
        """The model is sharded while loading (FSDP2, TP or EP): built through from_pretrained, never wrapped."""
        return self.fsdp or (self.tp_size or 1) > 1 or (self.ep_size or 1) > 1

    def distributed_config(self) -> DistributedConfig | None:
        """transformers' `DistributedConfig` for a sharded run, None for one process or DDP."""
        return sharding_config(self.fsdp_size, self.tp_size, self.ep_size)


def sharding_config(
    fsdp_size: int | None = None, tp_size: int | None = None, ep_size: int | None = None
) -> DistributedConfig | None:
    """The `DistributedConfig` the Trainer can train with, or None (one process, DDP); a layout that cannot be
    trained fails here in one line, before any data is read or model built."""
    if max(fsdp_size or 1, tp_size or 1, ep_size or 1) == 1:
        return None
    if not SHARDING_READY:
        raise HiResUserError(
            f"Sharded training (--fsdp / --tp / --ep) needs transformers >= 5.24 (found {transformers.__version__}): "
            "pip install -U 'transformers>=5.24,<5.30'."
        )
    if (tp_size or 1) > 1 and not torch.cuda.is_available():
        raise HiResUserError(
            "Tensor parallelism in the Trainer needs GPUs (accelerate refuses it on CPU processes); on CPU use "
            "--fsdp, or --fsdp --ep for MoE."
        )
    try:
        return DistributedConfig(fsdp_size=fsdp_size, tp_size=tp_size, ep_size=ep_size)
    except ValueError as error:  # a layout the engine cannot build: one line, naming the sizes
        raise HiResUserError(
            f"Cannot shard with fsdp_size={fsdp_size}, tp_size={tp_size}, ep_size={ep_size}: {error}"
        ) from error


def train_model(
    model: PreTrainedConfig | PreTrainedModel | str | Path,
    tokenizer: PreTrainedTokenizerBase,
    train_data: Dataset,
    eval_data: Dataset,
    settings: TrainSettings | None = None,
    *,
    output_dir: str | Path,
    callbacks: Sequence[TrainerCallback] = (),
    **overrides: Any,
) -> TrainResult:
    """Train a causal LM on packed blocks with AdamW + warmup + cosine; evaluate on `eval_data`.

    `model`: a config (trained from scratch, seeded by the settings' seed), a model, or a folder to continue from.
    `settings` says how (see TrainSettings); keyword arguments named like its fields override it, which keeps the
    older call style working: `train_model(config, tok, train, valid, output_dir=out, max_steps=200)`.
    """
    settings = _with_overrides(settings, overrides)
    output_dir = Path(output_dir)
    _check_run(output_dir, settings)
    args = _training_arguments(output_dir / "checkpoints", settings)
    model = _build_model(model, args, settings, output_dir)
    check_vocab(tokenizer, model.config)

    history = _history(model.config, train_data, settings, args.world_size // (settings.tp_size or 1))
    trainer = HiResTrainer(
        model=model,
        args=args,
        train_dataset=train_data,
        eval_dataset=eval_data,
        processing_class=tokenizer,
        callbacks=[history, StopCallback(settings.max_seconds), *callbacks],
    )
    if settings.progress:  # one bar with the latest losses, instead of a printed dict per log
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(LossBarCallback())

    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=True if settings.resume else None)
    seconds = time.perf_counter() - start

    model_dir = _save_final(trainer, output_dir / "model") if settings.save_model else None
    result = _result(trainer, history, seconds, model_dir, sharded=settings.sharded)
    if args.should_save:
        write_json_atomic(output_dir / "train_result.json", result.to_json())
    return result


def _with_overrides(settings: TrainSettings | None, overrides: dict[str, Any]) -> TrainSettings:
    """`settings` with the keyword arguments that name its fields changed; any other name is a TypeError."""
    names = {item.name for item in fields(TrainSettings)}
    if unknown := sorted(set(overrides) - names):
        raise TypeError(f"train_model() got unexpected keyword arguments {unknown}; TrainSettings has {sorted(names)}")
    if settings is None:
        if "max_steps" not in overrides:
            raise TypeError("train_model() needs settings=TrainSettings(max_steps=...) or max_steps=...")
        return TrainSettings(**overrides)
    return replace(settings, **overrides)


def _history(
    config: PreTrainedConfig, train_data: Dataset, settings: TrainSettings, data_parallel_size: int
) -> HistoryCallback:
    """The log keeper: tokens per optimizer step (all ranks that read their own batches; tensor-parallel ranks
    share one) and counted FLOPs per token, for every row."""
    block_size = int(train_data[0]["input_ids"].shape[-1])
    flops_per_token = settings.flops_per_token
    if flops_per_token is None:
        flops_per_token = train_flops_per_token(config, block_size)
    tokens_per_step = settings.batch_size * settings.gradient_accumulation_steps * data_parallel_size * block_size
    return HistoryCallback(tokens_per_step, flops_per_token)


def _check_run(output_dir: Path, settings: TrainSettings) -> None:
    """Everything that can fail before a model is built: the output folder, and what resuming needs."""
    ensure_writable(output_dir)
    if settings.resume and settings.sharded:
        raise HiResUserError(
            "--resume is not available for a model sharded while loading (FSDP2 / TP / EP): transformers cannot "
            "checkpoint its optimizer."
        )
    settings.distributed_config()  # a layout the engine or the Trainer refuses fails here, before a model is built
    if settings.resume:
        require_checkpoint(output_dir)


def _training_arguments(checkpoints: Path, settings: TrainSettings) -> TrainingArguments:
    """The run's TrainingArguments: the settings, with the defaults TrainSettings documents filled in."""
    cuda = torch.cuda.is_available()
    steps = settings.max_steps
    return TrainingArguments(
        output_dir=str(checkpoints),
        max_steps=steps,
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=16,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        learning_rate=settings.learning_rate,
        warmup_steps=warmup_steps(steps) if settings.warmup_steps is None else settings.warmup_steps,
        weight_decay=settings.weight_decay,
        lr_scheduler_type=SCHEDULE,
        lr_scheduler_kwargs={"min_lr_rate": MIN_LR_RATE},
        adam_beta1=ADAM_BETAS[0],
        adam_beta2=ADAM_BETAS[1],
        max_grad_norm=MAX_GRAD_NORM,
        optim="adamw_torch",
        eval_strategy="steps",
        eval_steps=settings.eval_steps or max(1, steps // 10),
        eval_on_start=True,  # the step-0 loss, and never `evaluate()` before `train()` (see module docstring)
        prediction_loss_only=True,
        logging_steps=settings.logging_steps or max(1, steps // 50),
        save_strategy="steps" if settings.save_steps else "no",
        save_steps=settings.save_steps or 500,
        save_total_limit=2,
        save_only_model=settings.sharded,  # transformers cannot checkpoint the optimizer of a sharded-at-load model
        report_to="none",
        seed=settings.seed,
        data_seed=settings.seed,
        bf16=settings.bf16,
        tf32=settings.tf32 or None,
        **{CHECKPOINTING_ARG: settings.activation_checkpointing or None},
        use_cpu=not cuda,
        ddp_backend="gloo" if not cuda and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        dataloader_num_workers=0,
        disable_tqdm=not settings.progress,
        log_level="warning",
    )


def _build_model(
    spec: PreTrainedConfig | PreTrainedModel | str | Path,
    args: TrainingArguments,
    settings: TrainSettings,
    output_dir: Path,
) -> PreTrainedModel:
    """A fresh seeded model from a config, the model given, or a saved folder; sharded while loading if asked."""
    set_seed(settings.seed)
    distributed = settings.distributed_config()
    if isinstance(spec, PreTrainedModel):
        if distributed:
            raise HiResUserError(
                "FSDP2 / TP / EP shard a model while loading it: pass a config or a folder, not a model."
            )
        return spec
    if isinstance(spec, PreTrainedConfig):
        if not distributed:
            return AutoModelForCausalLM.from_config(spec)
        folder = output_dir / "init"  # sharding happens in from_pretrained: write the seeded init once
        with args.main_process_first(local=False, desc="initial weights"):
            if args.should_save:
                AutoModelForCausalLM.from_config(spec).save_pretrained(folder)
        spec = folder
    folder = Path(spec)
    if not (folder / "config.json").is_file():
        raise HiResUserError(f"{folder} is not a model folder (no config.json).")
    if not distributed:
        return AutoModelForCausalLM.from_pretrained(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, distributed_config=distributed)
    except ValueError as error:  # e.g. ep_size on a dense model: transformers names the missing plan
        raise HiResUserError(f"Cannot shard {folder} that way: {error}") from error
    if folder == output_dir / "init":
        with args.main_process_first(local=False, desc="clean up initial weights"):
            pass  # every rank has loaded them
        if args.should_save:
            shutil.rmtree(folder)
    return model


def _global_params(model: torch.nn.Module) -> int:
    """Parameter count of a model whose parameters may be DTensor shards."""
    return sum(math.prod(p.shape) for p in model.parameters())


def _save_final(trainer: Trainer, model_dir: Path) -> Path:
    """Save model + tokenizer through a temporary folder, so `model_dir` is never half written.

    The folder is written from a plain (unsharded, unwrapped) copy: saving an FSDP2 model directly would copy
    torch's FSDP sources in place of modeling_hires.py as the remote code.
    """
    model = _plain_model(trainer.model)  # every rank joins: FSDP2 gathers the shards
    if trainer.args.should_save:
        with staged_folder(model_dir) as staging:
            model.save_pretrained(staging)
            save_tokenizer(trainer.processing_class, staging, getattr(model.config, "max_position_embeddings", None))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    return model_dir


def _plain_model(model: PreTrainedModel) -> PreTrainedModel:
    """The model itself, or for an FSDP2-sharded one a full copy of its class built from the gathered weights."""
    if not getattr(model, "is_distributed_loading_by_transformers", False):
        return model
    from torch.distributed.tensor import DTensor

    state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
    config = type(model.config).from_dict(model.config.to_dict())  # without the distributed settings
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(state)
    return plain


def _result(
    trainer: HiResTrainer, history: HistoryCallback, seconds: float, model_dir: Path | None, *, sharded: bool
) -> TrainResult:
    """What the run did: losses, tokens and counted FLOPs, parameters, and training throughput (evaluation time
    taken out)."""
    evals = [row for row in history.rows if "eval_loss" in row]
    steps = trainer.state.global_step
    tokens = steps * history.tokens_per_step
    flops_per_token = history.flops_per_token
    params = _global_params(trainer.model) if sharded else sum(p.numel() for p in trainer.model.parameters())
    train_seconds = max(seconds - trainer.eval_seconds, 1e-9)
    return TrainResult(
        final_eval_loss=evals[-1]["eval_loss"] if evals else float("nan"),
        history=history.rows,
        tokens_seen=tokens,
        flops=tokens * flops_per_token,
        flops_per_token=flops_per_token,
        params=params,
        train_seconds=train_seconds,
        tokens_per_second=tokens / train_seconds,
        model_dir=model_dir,
        extra={"steps": steps},
        model=trainer.model,
    )


def require_checkpoint(output_dir: Path) -> Path:
    """The last checkpoint of a run, or a clear error saying there is none to resume from."""
    checkpoints = Path(output_dir) / "checkpoints"
    last = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    if last is None:
        raise HiResUserError(f"--resume: no checkpoint under {checkpoints}; train with --save-steps first.")
    return Path(last)


__all__ = [
    "HiResTrainer",
    "TrainResult",
    "TrainSettings",
    "require_checkpoint",
    "sharding_config",
    "train_model",
]
