"""`hires-hf demo`: a tiny HiRes and its vanilla twin, trained on the same text for the same counted FLOPs.

Comparison rule: **equal counted training FLOPs** (hires_hf.accounting), not equal tokens. HiRes spends extra
FLOPs per token on its read / write projections; efficiency claims are made on counted FLOPs
(docs/architecture.md, cost accounting), so each model gets the number of tokens that its FLOPs per token
buys from one shared budget (HiRes therefore sees fewer tokens). Both see the same batches in the same order,
from the same seed.

The budget is wall-clock: a few timed steps of each model turn the minutes into a FLOP budget that both runs
together fit in (evaluation, saving and sampling included through a reserve).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedConfig, PreTrainedTokenizerBase

from ..accounting import train_flops_per_token
from ..configuration_hires import HiResConfig
from ..twins import vanilla_config
from .data import PackedDataset, load_default_corpus, pack
from .loop import pick_device, time_train_step
from .tokenizer import build_tokenizer, encode_documents, special_token_ids
from .trainer import TrainResult, ensure_writable, train_model


@dataclass(frozen=True)
class DemoSettings:
    """Sizes of one demo run; `smoke()` is the seconds-long version tests and CI use."""

    preset: str = "tiny"
    budget_minutes: float = 5.0
    max_chars: int = 4_000_000
    tokenizer_sample_chars: int = 1_000_000
    block_size: int = 128
    batch_size: int = 16
    eval_blocks: int = 96
    learning_rate: float = 2e-3
    evaluations: int = 12
    smoke_steps: int | None = None  # fixed vanilla steps instead of a timed budget
    sample_tokens: int = 60
    downstream_limit: int | None = 200  # docs per offline task (None: all); 0 skips the downstream tasks
    seed: int = 0

    @classmethod
    def smoke(cls, **overrides: object) -> DemoSettings:
        fields = dict(
            max_chars=200_000,
            tokenizer_sample_chars=100_000,
            block_size=32,
            batch_size=4,
            eval_blocks=8,
            evaluations=2,
            smoke_steps=6,
            sample_tokens=12,
            downstream_limit=4,
        )
        return cls(**{**fields, **overrides})


@dataclass
class DemoResult:
    hires: TrainResult
    vanilla: TrainResult
    table: str
    plot: Path
    samples: dict[str, str]
    downstream: str | None = None  # markdown table of the offline lm-eval tasks, both models side by side


RESERVE = 0.40  # share of the budget kept for evaluation, saving, sampling, Trainer overhead and a busy CPU


def run_demo(output_dir: str | Path = "runs/demo", settings: DemoSettings | None = None) -> DemoResult:
    """Train, compare, plot, save and sample; everything lands under `output_dir`."""
    settings = settings or DemoSettings()
    output_dir = Path(output_dir)
    ensure_writable(output_dir)
    started = time.perf_counter()

    corpus = load_default_corpus(max_chars=settings.max_chars)
    hires_config = HiResConfig.from_preset(settings.preset)
    tokenizer = build_tokenizer(
        corpus.train, vocab_size=hires_config.vocab_size, sample_chars=settings.tokenizer_sample_chars
    )
    hires_config = HiResConfig.from_preset(settings.preset, **special_token_ids(tokenizer))
    twin_config = vanilla_config(hires_config)
    eos = tokenizer.eos_token_id
    train_data = PackedDataset(pack(encode_documents(tokenizer, corpus.train), settings.block_size, eos))
    eval_blocks = pack(encode_documents(tokenizer, corpus.validation), settings.block_size, eos)
    eval_data = PackedDataset(eval_blocks[: settings.eval_blocks])

    configs = {"hires": hires_config, "vanilla": twin_config}
    flops = {name: train_flops_per_token(config, settings.block_size) for name, config in configs.items()}
    tokens_per_step = settings.batch_size * settings.block_size
    step_seconds = {name: _seconds_per_step(config, settings) for name, config in configs.items()}
    budget = _flop_budget(flops, step_seconds, tokens_per_step, settings, time.perf_counter() - started)
    print(
        f"Equal-compute comparison: {budget:.3g} counted training FLOPs each "
        f"(HiRes {flops['hires']:,.0f} FLOPs/token, vanilla {flops['vanilla']:,.0f} FLOPs/token)."
    )

    results = {}
    for name, config in configs.items():
        steps = max(1, math.floor(budget / (flops[name] * tokens_per_step)))
        print(f"Training {name}: {steps} steps x {tokens_per_step} tokens")
        results[name] = train_model(
            config,
            tokenizer,
            train_data,
            eval_data,
            output_dir=output_dir / name,
            max_steps=steps,
            batch_size=settings.batch_size,
            learning_rate=settings.learning_rate,
            eval_steps=max(1, steps // settings.evaluations),
            logging_steps=max(1, steps // 20),
            seed=settings.seed,
            flops_per_token=flops[name],
            # a guard against a much slower machine than timed: the table then shows the FLOPs actually spent
            max_seconds=None if settings.smoke_steps else 1.5 * steps * step_seconds[name] + 10,
            bf16=pick_device().type == "cuda",  # as the step was timed: the Trainer trains on CUDA when there is one
        )

    table = comparison_table(results)
    plot = plot_curves(results, output_dir / "loss_vs_flops.png")
    samples = {name: sample(result.model_dir, tokenizer, settings) for name, result in results.items()}
    downstream = None
    if settings.downstream_limit != 0:
        downstream = evaluate_downstream({name: r.model_dir for name, r in results.items()}, output_dir, settings)
    _write_report(output_dir, table, results, samples)
    print("\n" + table + "\n")
    if downstream:
        print(f"Offline downstream tasks (lm-eval; stdlib_next_line: chance 0.25):\n{downstream}\n")
    for name, text in samples.items():
        print(f"--- {name} sample ---\n{text}\n")
    print(f"Plot: {plot}\nModels: {results['hires'].model_dir}, {results['vanilla'].model_dir}")
    return DemoResult(results["hires"], results["vanilla"], table, plot, samples, downstream)


def evaluate_downstream(model_dirs: dict[str, Path], output_dir: Path, settings: DemoSettings) -> str | None:
    """The offline stdlib tasks through lm-eval on every model; writes downstream.json / .md, returns the table."""
    try:
        import lm_eval  # noqa: F401
    except ModuleNotFoundError:
        print("lm-eval is not installed (pip install 'hires-hf[eval]'): skipping the downstream tasks.")
        return None
    from ..eval import harness

    manager = harness.task_manager(harness.OFFLINE_TASKS)
    results = {
        name: harness.evaluate(
            str(folder), harness.OFFLINE_TASKS, manager, limit=settings.downstream_limit, dtype="float32"
        )
        for name, folder in model_dirs.items()
    }
    table = harness.results_table(results)
    harness.write_results(output_dir / "downstream.json", results, table)
    return table


def _flop_budget(
    flops: dict[str, float],
    step_seconds: dict[str, float],
    tokens_per_step: int,
    settings: DemoSettings,
    spent_seconds: float,
) -> float:
    """Counted FLOPs each model may use so that both runs fit the wall-clock budget.

    With seconds per step t_m and FLOPs per step f_m, a budget F costs sum_m F * t_m / f_m seconds.
    """
    if settings.smoke_steps is not None:
        return settings.smoke_steps * tokens_per_step * flops["vanilla"]
    seconds_left = settings.budget_minutes * 60 * (1 - RESERVE) - spent_seconds
    per_flop = sum(step_seconds[name] / (flops[name] * tokens_per_step) for name in flops)
    return max(seconds_left, 1.0) / per_flop


def _seconds_per_step(config: PreTrainedConfig, settings: DemoSettings) -> float:
    """Timed AdamW steps of a throw-away copy on the device the Trainer will use; 0 for a smoke run."""
    if settings.smoke_steps is not None:
        return 0.0
    return time_train_step(config, settings.batch_size, settings.block_size, pick_device())


def comparison_table(results: dict[str, TrainResult]) -> str:
    """Markdown: params, counted FLOPs/token, tokens, FLOPs, validation loss, throughput, side by side."""
    rows = [
        "| model | params | train FLOPs/token | tokens seen | counted train FLOPs | val loss | tokens/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        rows.append(
            f"| {name} | {result.params:,} | {result.flops_per_token:,.0f} | {result.tokens_seen:,} |"
            f" {result.flops:.3e} | {result.final_eval_loss:.4f} | {result.tokens_per_second:,.0f} |"
        )
    return "\n".join(rows)


def plot_curves(results: dict[str, TrainResult], path: Path) -> Path:
    """Validation loss against counted training FLOPs, one line per model (PNG, written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    for name, result in results.items():
        x, y = result.eval_curve()
        axis.plot(x, y, marker="o", markersize=3, label=f"{name} ({result.params:,} params)")
    axis.set_xlabel("counted training FLOPs")
    axis.set_ylabel("validation loss")
    axis.set_title("HiRes vs vanilla twin at equal counted FLOPs")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    staging = path.with_name(path.stem + ".tmp.png")
    figure.savefig(staging, dpi=120)
    plt.close(figure)
    staging.replace(path)
    return path


def sample(model_dir: Path, tokenizer: PreTrainedTokenizerBase, settings: DemoSettings, prompt: str = "def ") -> str:
    """Generate from the saved folder (which also proves it loads with AutoModelForCausalLM)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    inputs = tokenizer(prompt, return_tensors="pt")
    torch.manual_seed(settings.seed)
    output = model.generate(
        **inputs,
        max_new_tokens=settings.sample_tokens,
        do_sample=True,
        temperature=0.8,
        top_k=40,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.decode(output[0], skip_special_tokens=True)


def _write_report(output_dir: Path, table: str, results: dict[str, TrainResult], samples: dict[str, str]) -> None:
    summary = {
        "comparison": "equal counted training FLOPs (hires_hf.accounting); HiRes sees fewer tokens",
        "results": {name: {**result.to_json(), "history": None} for name, result in results.items()},
        "samples": samples,
    }
    downstream = output_dir / "downstream.json"  # the offline lm-eval tasks, when they ran: their metrics
    if downstream.is_file():
        models = json.loads(downstream.read_text())["models"]
        summary["downstream"] = {name: evaluation.get("results") for name, evaluation in models.items()}
    for name, text in (("table.md", table + "\n"), ("results.json", json.dumps(summary, indent=2))):
        staging = output_dir / (name + ".tmp")
        staging.write_text(text)
        staging.replace(output_dir / name)
    for name in results:
        shutil.rmtree(output_dir / name / "checkpoints", ignore_errors=True)  # the demo saves no checkpoints


__all__ = [
    "DemoResult",
    "DemoSettings",
    "comparison_table",
    "evaluate_downstream",
    "plot_curves",
    "run_demo",
    "sample",
]
