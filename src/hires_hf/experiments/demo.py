"""`hires-hf demo`: a tiny HiRes, the control and the plain twin, trained on the same text for the same counted FLOPs.

Three rows, the baseline first:
- `control`: the Llama twin with HiRes's embedding scale in its forward (x 1/initializer_range), the strongest
  simple vanilla; HiRes is judged against it (the gap HiRes minus control is printed and stored);
- `hires`: the preset;
- `plain-twin`: the Llama twin as transformers builds it, a second row.

Comparison rule: **equal counted training FLOPs** (hires_hf.accounting), not equal tokens. HiRes spends extra
FLOPs per token on its read / write projections, so it gets the fewer tokens its FLOPs per token buy from the
shared budget. Every model sees the same batches in the same order, from the same seed.

Everything but the training itself comes from the experiment harness (`hires_hf.experiments.harness`): the data
(`prepare_data`), the configs (`Shape`, `Arm`), the budget (`plan_budget`: counted FLOPs, so that the numbers are
the same on every machine; `--budget-minutes` times this one instead) and the saved folders (`save_model`, which
folds the control's embedding scale into its weights). Training goes through the HF Trainer (`train_model`), the
path users train with.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from ..configuration_hires import HiResConfig
from ..errors import HiResUserError
from ..eval.harness import no_transformers_bars
from ..io import ensure_writable, write_json_atomic, write_text_atomic
from ..plotting import ARM_COLOURS, Curve, draw_loss_vs_flops, pyplot, save_figure
from ..tables import markdown_row, markdown_table
from ..training.data import PackedDataset
from ..training.loop import pick_device, resolve_precision
from ..training.trainer import TrainResult, train_model
from .harness import (
    HIRES,
    Arm,
    Budget,
    Data,
    Shape,
    baseline_arms,
    plan_budget,
    prepare_data,
    save_model,
)

CONTROL_ROW, HIRES_ROW, PLAIN_ROW = "control", "hires", "plain-twin"


@dataclass(frozen=True)
class DemoSettings:
    """Sizes of one demo run; `smoke()` is the seconds-long version tests and CI use."""

    preset: str = "tiny"
    budget_flops: float | None = 1.5e12  # counted training FLOPs per model: the same numbers on any machine
    budget_minutes: float | None = None  # or: what this machine's measured speed buys in these minutes
    max_chars: int = 4_000_000
    validation_fraction: float = 0.05
    block_size: int = 128
    batch_size: int = 16
    eval_blocks: int = 96
    learning_rate: float = 2e-3
    evaluations: int = 12
    smoke_steps: int | None = None  # fixed control steps instead of a FLOP budget
    precision: str = "auto"  # bf16 autocast where bf16 matmuls are native (CUDA, AMX / AVX512-BF16 CPUs)
    sample_tokens: int = 60
    downstream_limit: int | None = 200  # docs per offline task (None: all); 0 skips the downstream tasks
    seed: int = 0

    @classmethod
    def smoke(cls, **overrides: object) -> DemoSettings:
        fields = dict(
            max_chars=200_000,
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
    results: dict[str, TrainResult]  # control (the baseline), hires, plain-twin: in that order
    table: str
    plot: Path
    samples: dict[str, str]
    downstream: str | None = None  # markdown table of the offline lm-eval tasks, the models side by side

    @property
    def gap(self) -> float:
        """HiRes minus control, final validation loss (nats): negative when HiRes is ahead."""
        return self.results[HIRES_ROW].final_eval_loss - self.results[CONTROL_ROW].final_eval_loss


COLOURS = ARM_COLOURS  # as every figure of the package draws them
RESERVE = 0.40  # share of the budget kept for evaluation, saving, sampling, Trainer overhead and a busy CPU


def demo_arms() -> list[Arm]:
    """The control (the baseline), HiRes, the plain twin."""
    control, plain = baseline_arms(plain=True)
    return [control, Arm(HIRES_ROW, HIRES), plain]


def demo_data(settings: DemoSettings) -> Data:
    """The stdlib sample, a BPE of the preset's vocabulary, packed blocks (the harness's data path)."""
    vocab_size = HiResConfig.from_preset(settings.preset).vocab_size
    return prepare_data(
        "stdlib",
        vocab_size,
        settings.block_size,
        settings.max_chars,
        validation_fraction=settings.validation_fraction,
        eval_blocks=settings.eval_blocks,
    )


def demo_shape(preset: str) -> Shape:
    """The preset as a harness shape, keeping the preset's context length (512 for `tiny`), which the harness would
    otherwise derive from the blocks: the saved models then take the downstream tasks' prompts whole."""
    config = HiResConfig.from_preset(preset)
    shape = Shape.from_config(config)
    return replace(shape, overrides=(*shape.overrides, ("max_position_embeddings", config.max_position_embeddings)))


@no_transformers_bars()  # saving and reloading the models draws none: the log shows the training bars and results
def run_demo(output_dir: str | Path = "runs/demo", settings: DemoSettings | None = None) -> DemoResult:
    """Train, compare, plot, save and sample; everything lands under `output_dir`."""
    settings = settings or DemoSettings()
    output_dir = Path(output_dir)
    ensure_writable(output_dir)
    started = time.perf_counter()

    data = demo_data(settings)
    shape = demo_shape(settings.preset)
    arms = demo_arms()
    budget = demo_budget(settings, arms, shape, data, time.perf_counter() - started)
    flops = {arm.name: arm.flops_per_token(shape, data) for arm in arms}
    steps = {arm.name: budget.steps(flops[arm.name], data.context) for arm in arms}
    if min(steps.values()) < 1:
        raise HiResUserError(
            f"The budget ({budget.flops:.3g} FLOPs a model) buys less than one training step of each model here; "
            "give it more FLOPs or minutes."
        )
    bf16 = resolve_precision(pick_device(), settings.precision) == "bf16"
    print(
        f"Equal-compute comparison: {budget.flops:.3g} counted training FLOPs each "
        f"(control and plain twin {flops[CONTROL_ROW]:,.0f} FLOPs/token, HiRes {flops[HIRES_ROW]:,.0f})."
    )

    results = {}
    train_data, eval_data = PackedDataset(data.train), PackedDataset(data.validation)
    tokens_per_step = settings.batch_size * data.context
    for arm in arms:
        print(f"Training {arm.name}: {steps[arm.name]} steps x {tokens_per_step} tokens")
        torch.manual_seed(settings.seed)  # the same initial layers for the control and the plain twin
        model = arm.model(shape, data)  # the control: HiRes's embedding scale as a forward hook
        result = train_model(
            model,
            data.tokenizer,
            train_data,
            eval_data,
            output_dir=output_dir / arm.name,
            max_steps=steps[arm.name],
            batch_size=settings.batch_size,
            learning_rate=settings.learning_rate,
            eval_steps=max(1, steps[arm.name] // settings.evaluations),
            logging_steps=max(1, steps[arm.name] // 20),
            seed=settings.seed,
            flops_per_token=flops[arm.name],
            bf16=bf16,  # the harness's precision rule, on the device the Trainer picks (CUDA when there is one)
            save_model=False,  # saved below, with the control's scale folded into its embedding
        )
        result.model_dir = output_dir / arm.name / "model"
        save_model(result.model, arm, shape, data, result.model_dir)
        results[arm.name] = result

    table = comparison_table(results)
    plot = plot_curves(results, output_dir / "loss_vs_flops.png")
    samples = {name: sample(result.model_dir, data.tokenizer, settings) for name, result in results.items()}
    downstream = None
    if settings.downstream_limit != 0:
        downstream = evaluate_downstream({name: r.model_dir for name, r in results.items()}, output_dir, settings)
    _write_report(output_dir, table, results, samples)
    print("\n" + table + "\n")
    if downstream:
        print(f"Offline downstream tasks (lm-eval; stdlib_next_line: chance 0.25):\n{downstream}\n")
    for name, text in samples.items():
        print(f"--- {name} sample ---\n{text}\n")
    print(f"Plot: {plot}\nModels: {', '.join(str(r.model_dir) for r in results.values())}")
    return DemoResult(results, table, plot, samples, downstream)


def demo_budget(settings: DemoSettings, arms: list[Arm], shape: Shape, data: Data, spent_seconds: float) -> Budget:
    """Counted FLOPs per model (the harness's planner): `budget_flops`, or what `budget_minutes` leave after a
    reserve for evaluation, saving, sampling and the downstream tasks; a smoke run takes `smoke_steps` steps."""
    control = arms[0]
    if settings.smoke_steps is not None:
        return plan_budget(control, shape, data, settings.batch_size, steps=settings.smoke_steps)
    if settings.budget_minutes is None:
        return plan_budget(control, shape, data, settings.batch_size, flops=settings.budget_flops)
    minutes = max(settings.budget_minutes * (1 - RESERVE) - spent_seconds / 60, 1 / 60)
    return plan_budget(
        control,
        shape,
        data,
        settings.batch_size,
        minutes=minutes,
        runs=len(arms),
        device=pick_device(),
        precision=settings.precision,
    )


def evaluate_downstream(model_dirs: dict[str, Path], output_dir: Path, settings: DemoSettings) -> str | None:
    """The offline stdlib tasks through lm-eval on every model; writes downstream.json / .md, returns the table."""
    try:
        import lm_eval  # noqa: F401
    except ModuleNotFoundError:
        print("lm-eval is not installed (pip install 'hires-hf[eval]'): skipping the downstream tasks.")
        return None
    from ..eval import harness

    manager = harness.task_manager(harness.OFFLINE_TASKS)
    results = {}
    # one bar for the models, instead of lm-eval's ten or so a model
    for name, folder in tqdm(model_dirs.items(), desc="Downstream tasks (lm-eval)", unit="model"):
        results[name] = harness.evaluate(
            str(folder),
            harness.OFFLINE_TASKS,
            manager,
            limit=settings.downstream_limit,
            dtype="float32",
            progress=False,
        )
    table = harness.results_table(results)
    harness.write_results(output_dir / "downstream.json", results, table)
    return table


def comparison_table(results: dict[str, TrainResult]) -> str:
    """Markdown: params, counted FLOPs/token, tokens, FLOPs, validation loss and its gap to the control (the
    first row, the baseline), throughput; then the gap HiRes minus control in words."""
    header = ["model", "params", "train FLOPs/token", "tokens seen", "counted train FLOPs", "val loss", "vs control"]
    rows = markdown_table([*header, "tokens/s"], align="l" + "r" * 7)
    baseline = results[CONTROL_ROW].final_eval_loss
    for name, result in results.items():
        gap = "baseline" if name == CONTROL_ROW else f"{result.final_eval_loss - baseline:+.4f}"
        numbers = [f"{result.params:,}", f"{result.flops_per_token:,.0f}", f"{result.tokens_seen:,}"]
        numbers += [f"{result.flops:.3e}", f"{result.final_eval_loss:.4f}", gap, f"{result.tokens_per_second:,.0f}"]
        rows.append(markdown_row([name, *numbers]))
    gap = results[HIRES_ROW].final_eval_loss - baseline
    side = "behind" if gap > 0 else "ahead of"
    rows += [
        "",
        f"HiRes minus control: {gap:+.4f} nats of validation loss at equal counted FLOPs (HiRes {side} the "
        "control; one seed, one learning rate: `hires-hf compare` sweeps both and adds seeds).",
    ]
    return "\n".join(rows)


def plot_curves(results: dict[str, TrainResult], path: Path) -> Path:
    """Validation loss against counted training FLOPs, one line per model (PNG, written atomically)."""
    curves = [
        Curve(f"{name} ({result.params:,} params)", list(zip(*result.eval_curve())), COLOURS.get(name), marker="o")
        for name, result in results.items()
    ]
    figure, axis = pyplot().subplots(figsize=(6.4, 4.2))
    draw_loss_vs_flops(axis, curves, "HiRes, the control and the plain twin at equal counted FLOPs")
    return save_figure(figure, path, dpi=120)


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
        "baseline": CONTROL_ROW,
        "hires_minus_control": results[HIRES_ROW].final_eval_loss - results[CONTROL_ROW].final_eval_loss,
        "results": {name: {**result.to_json(), "history": None} for name, result in results.items()},
        "samples": samples,
    }
    downstream = output_dir / "downstream.json"  # the offline lm-eval tasks, when they ran: their metrics
    if downstream.is_file():
        models = json.loads(downstream.read_text())["models"]
        summary["downstream"] = {name: evaluation.get("results") for name, evaluation in models.items()}
    write_text_atomic(output_dir / "table.md", table + "\n")
    write_json_atomic(output_dir / "results.json", summary)
    for name in results:
        shutil.rmtree(output_dir / name / "checkpoints", ignore_errors=True)  # the demo saves no checkpoints


__all__ = [
    "DemoResult",
    "DemoSettings",
    "comparison_table",
    "demo_arms",
    "demo_data",
    "demo_shape",
    "evaluate_downstream",
    "plan_budget",
    "plot_curves",
    "run_demo",
    "sample",
]
