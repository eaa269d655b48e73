"""A plain, device-aware training loop for measurements: compare, the sweep, the ladder, the stability benchmark.

It trains with the package's recipe, the same one `train_model` gives the HF Trainer: AdamW (betas 0.9 / 0.95,
weight decay 0.1 on matrices and embeddings, none on norms and biases), transformers' own
`cosine_with_min_lr` schedule (linear warmup from 0 over 5% of the steps, cosine down to 10% of the peak),
gradient clipping at 1.0, one learning rate for every parameter. What it adds for measurements:

- the packed data is moved to the training device once and batches are drawn there; the loss is only read back
  to the host at evaluations, so the GPU is never stalled by a per-step sync;
- bf16 autocast (fp32 master weights and optimizer) wherever the hardware has bf16 matrix instructions: CUDA,
  and CPUs with AMX or AVX512-BF16 (`bf16_matmul_hardware`); fp32 elsewhere or when asked;
- `torch.compile` of the training forward for runs long enough to repay the compile (`should_compile`);
- a checkpoint every few minutes (`checkpoint=`): a run killed at any point resumes to the result it would have
  reached uninterrupted (`hires_hf.training.checkpoint`);
- step times measured synchronised (`time_train_step`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedConfig, get_scheduler

from .checkpoint import load_checkpoint, save_checkpoint

# The package's optimisation recipe; `trainer.py` hands the same values to the HF Trainer.
ADAM_BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
WARMUP_FRACTION = 0.05
MIN_LR_RATE = 0.1  # the cosine ends at this share of the peak
MAX_GRAD_NORM = 1.0
SCHEDULE = "cosine_with_min_lr"  # transformers' scheduler name, in the loop and in the Trainer alike
PRECISIONS = ("auto", "bf16", "fp32")
COMPILES = ("auto", "on", "off")
# `torch.compile` pays when the run is long. On these CPUs (benchmarks/results/cpu_throughput) a first model of a
# shape compiles in 17-27 s, a second one of the same shape in the same process in 1-7 s (the graph is reused; a
# model with other hooks, below, compiles its own), and compiled runs train 1.08-1.42x faster than bf16 eager:
# compiling repays itself from 1.2e13-1.8e13 counted FLOPs a run at d=128, 4.4e13-9.8e13 at d=256 and 0.8e14-1.4e14
# at d=512. The threshold sits among the small shapes this CPU trains; a d=512 run just above it loses at most
# ~20 s. On a CPU without bf16 units (fp32; cpu_throughput/avx2) compiling gains 1.06-1.16x and repays itself from
# 2.4e13-4.7e13: the same threshold serves.
COMPILE_MIN_FLOPS = 3e13
# A compiled forward is reused by any later model of the same class and shapes, and by default dynamo does not check
# module hooks when it reuses one. The control's embedding scale is a forward hook (`scale_twin_embedding`): a
# control compiled after a plain twin in one process trained without its scale, and was evaluated (eager) with it.
# With hooks guarded, a model whose hooks differ gets its own graph; nothing else about reuse changes.
torch._dynamo.config.skip_nnmodule_hook_guards = False
CHECKPOINT_SECONDS = 300.0  # wall clock between checkpoints of a run that has somewhere to put them


@dataclass(frozen=True)
class LoopSettings:
    """One run: `steps` optimizer steps of `batch_size` packed blocks at peak `learning_rate`."""

    steps: int
    batch_size: int
    learning_rate: float
    weight_decay: float = WEIGHT_DECAY
    max_grad_norm: float = MAX_GRAD_NORM
    evaluations: int = 8  # evenly spaced, plus one before the first step
    eval_batch_size: int = 16
    seed: int = 0
    precision: str = "auto"  # "auto": bf16 autocast where bf16 matmuls are fast (bf16_matmul_hardware); or bf16 / fp32
    compile: bool = False  # torch.compile the training forward (the harness decides with `should_compile`)


@dataclass
class LoopResult:
    """Validation loss before training and at each evaluation (`curve`: [(step, loss)]) and the time spent."""

    curve: list[tuple[int, float]]
    steps: int
    tokens: int
    train_seconds: float
    diverged: bool = False
    train_losses: list[tuple[int, float]] = field(default_factory=list)

    @property
    def final_loss(self) -> float:
        """The last validation loss; infinite for a run that diverged (so it never wins a comparison)."""
        return float("inf") if self.diverged else self.curve[-1][1]

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.train_seconds, 1e-9)


def pick_device(name: str = "auto") -> torch.device:
    """The training device: with "auto", CUDA when there is one, else the CPU; any other name as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@cache
def bf16_matmul_hardware(device_type: str) -> bool:
    """Whether bf16 matrix products run natively here: CUDA, or a CPU with AMX tiles or AVX512-BF16 (where
    oneDNN's bf16 matmul is several times its fp32 one); elsewhere bf16 would be emulated and slower."""
    if device_type == "cuda":
        return True
    if device_type != "cpu":
        return False
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def resolve_precision(device: torch.device, precision: str = "auto") -> str:
    """ "bf16" or "fp32": "auto" is bf16 where the hardware has bf16 matrix instructions."""
    if precision not in PRECISIONS:
        raise ValueError(f"Unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}.")
    if precision == "auto":
        return "bf16" if bf16_matmul_hardware(device.type) else "fp32"
    return precision


def should_compile(run_flops: float, device: torch.device, choice: str = "auto") -> bool:
    """Compile the training forward when asked ("on"), or with "auto" for a run of at least COMPILE_MIN_FLOPS
    counted FLOPs on a CPU or GPU (decided from the run's size, never from a clock, so that the same run is always
    trained the same way)."""
    if choice not in COMPILES:
        raise ValueError(f"Unknown compile choice {choice!r}; choose one of {', '.join(COMPILES)}.")
    if choice != "auto":
        return choice == "on"
    return device.type in ("cpu", "cuda") and run_flops >= COMPILE_MIN_FLOPS


def autocast(device: torch.device, precision: str = "auto") -> AbstractContextManager:
    """bf16 autocast (weights and optimizer stay fp32) where `resolve_precision` says bf16; else fp32."""
    if resolve_precision(device, precision) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warmup_steps(steps: int) -> int:
    """Warmup length of a run of `steps` optimizer steps (the Trainer gets the same number)."""
    return max(1, round(WARMUP_FRACTION * steps))


def build_scheduler(optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """transformers' `cosine_with_min_lr` schedule over `steps`: the one learning-rate curve of every path."""
    return get_scheduler(
        SCHEDULE,
        optimizer,
        num_warmup_steps=warmup_steps(steps),
        num_training_steps=steps,
        scheduler_specific_kwargs={"min_lr_rate": MIN_LR_RATE},
    )


def build_optimizer(model: nn.Module, settings: LoopSettings) -> torch.optim.AdamW:
    """AdamW with decay on matrices and embeddings only (the Trainer leaves norms and biases undecayed too)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW(groups, lr=settings.learning_rate, betas=ADAM_BETAS, fused=fused or None)


@torch.no_grad()
def evaluate(model: nn.Module, blocks: torch.Tensor, batch_size: int, precision: str = "auto") -> float:
    """Mean next-token loss over packed `blocks` (already on the model's device)."""
    was_training = model.training
    model.eval()
    device = blocks.device
    # the language-model loss alone: an MoE model trained with router losses must not be scored with them
    lm_only = {"output_router_logits": False} if getattr(model.config, "num_experts", 0) else {}
    total = torch.zeros((), device=device)
    for start in range(0, blocks.shape[0], batch_size):
        batch = blocks[start : start + batch_size]
        with autocast(device, precision):
            total += model(input_ids=batch, labels=batch, **lm_only).loss.float() * batch.shape[0]
    model.train(was_training)
    return (total / blocks.shape[0]).item()


def batch_order(num_blocks: int, steps: int, batch_size: int, seed: int) -> torch.Tensor:
    """(steps, batch_size) block indices: shuffled epochs, fixed by `seed`, so that every model compared under
    one seed sees the same batches in the same order (a shorter run sees a prefix of them)."""
    generator = torch.Generator().manual_seed(seed)
    needed = steps * batch_size
    epochs = [torch.randperm(num_blocks, generator=generator) for _ in range(math.ceil(needed / num_blocks))]
    return torch.cat(epochs)[:needed].view(steps, batch_size)


def train_loop(
    model: nn.Module,
    train_blocks: torch.Tensor,
    valid_blocks: torch.Tensor,
    settings: LoopSettings,
    on_step: Callable[[int], None] | None = None,
    before_update: Callable[[nn.Module, int], None] | None = None,
    after_update: Callable[[nn.Module, int], None] | None = None,
    checkpoint: Path | None = None,
    checkpoint_seconds: float = CHECKPOINT_SECONDS,
) -> LoopResult:
    """Train `model` in place on `train_blocks` (moved to the model's device once) and evaluate on `valid_blocks`.

    `on_step(step)` is called after every optimizer step (a progress bar); `before_update` / `after_update`
    bracket the optimizer step (a `DiagnosticsRecorder`). A non-finite loss stops the run (`diverged`). With
    `checkpoint` (a file path), the run saves its state there every `checkpoint_seconds` and, if the file exists
    when it starts, continues from it: the result is the one the uninterrupted run gets. The caller removes the
    file once it has kept the result.
    """
    device = next(model.parameters()).device
    train_blocks, valid_blocks = train_blocks.to(device), valid_blocks.to(device)
    order = batch_order(train_blocks.shape[0], settings.steps, settings.batch_size, settings.seed).to(device)
    optimizer = build_optimizer(model, settings)
    scheduler = build_scheduler(optimizer, settings.steps)
    eval_at = _evaluation_steps(settings)
    progress = {"step": 0, "curve": [], "train_losses": [], "seconds": 0.0}
    if checkpoint is not None and checkpoint.exists():
        progress = load_checkpoint(checkpoint, model, optimizer, scheduler)
    else:
        progress["curve"] = [(0, evaluate(model, valid_blocks, settings.eval_batch_size, settings.precision))]
    curve = [tuple(point) for point in progress["curve"]]
    train_losses = [tuple(point) for point in progress["train_losses"]]
    forward = torch.compile(model) if settings.compile else model
    pending: list[tuple[int, torch.Tensor]] = []  # losses still on the device: read back in bulk
    model.train()
    synchronize(device)
    start, eval_seconds, diverged = time.perf_counter(), 0.0, False
    last_save = start
    for step in range(progress["step"], settings.steps):
        batch = train_blocks[order[step]]
        with autocast(device, settings.precision):
            loss = forward(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        if before_update is not None:
            before_update(model, step)
        optimizer.step()
        scheduler.step()
        if after_update is not None:
            after_update(model, step)
        optimizer.zero_grad(set_to_none=True)
        pending.append((step + 1, loss.detach()))
        if step + 1 in eval_at:
            tick = time.perf_counter()
            curve.append((step + 1, evaluate(model, valid_blocks, settings.eval_batch_size, settings.precision)))
            eval_seconds += time.perf_counter() - tick
            if not math.isfinite(curve[-1][1]):
                diverged = True
        if checkpoint is not None and not diverged and time.perf_counter() - last_save >= checkpoint_seconds:
            train_losses += _read_back(pending)
            seconds = progress["seconds"] + time.perf_counter() - start - eval_seconds
            state = {"step": step + 1, "curve": curve, "train_losses": train_losses, "seconds": seconds}
            save_checkpoint(checkpoint, model, optimizer, scheduler, state)
            last_save = time.perf_counter()
        if on_step is not None:
            on_step(step)
        if diverged:
            break
    synchronize(device)
    seconds = progress["seconds"] + time.perf_counter() - start - eval_seconds
    train_losses += _read_back(pending)
    done = curve[-1][0] if diverged else settings.steps
    tokens = done * settings.batch_size * train_blocks.shape[1]
    return LoopResult(curve, done, tokens, seconds, diverged, train_losses)


def _read_back(pending: list[tuple[int, torch.Tensor]]) -> list[tuple[int, float]]:
    """The pending per-step losses as floats, in one device-to-host copy; empties `pending`."""
    if not pending:
        return []
    values = torch.stack([value for _, value in pending]).float().tolist()
    read = [(step, value) for (step, _), value in zip(pending, values)]
    pending.clear()
    return read


def _evaluation_steps(settings: LoopSettings) -> set[int]:
    count = max(1, settings.evaluations)
    return {max(1, round(settings.steps * (i + 1) / count)) for i in range(count)}


def time_train_step(
    config: PreTrainedConfig,
    batch_size: int,
    block_size: int,
    device: torch.device | str = "cpu",
    steps: int = 3,
    precision: str = "auto",
) -> float:
    """Seconds per optimizer step of a throw-away model built on `device` (after one warm-up step, timed
    between device synchronisations, with the loop's autocast): turns a wall-clock budget into steps."""
    device = torch.device(device)
    model = AutoModelForCausalLM.from_config(config).to(device)
    optimizer = build_optimizer(model, LoopSettings(steps=1, batch_size=batch_size, learning_rate=1e-4))
    batch = torch.randint(0, config.vocab_size, (batch_size, block_size), device=device)
    for step in range(steps + 1):
        if step == 1:
            synchronize(device)
            start = time.perf_counter()
        with autocast(device, precision):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    seconds = (time.perf_counter() - start) / steps
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return seconds


__all__ = [
    "ADAM_BETAS",
    "MIN_LR_RATE",
    "SCHEDULE",
    "LoopResult",
    "LoopSettings",
    "autocast",
    "batch_order",
    "bf16_matmul_hardware",
    "build_scheduler",
    "evaluate",
    "pick_device",
    "resolve_precision",
    "should_compile",
    "time_train_step",
    "train_loop",
    "warmup_steps",
]
