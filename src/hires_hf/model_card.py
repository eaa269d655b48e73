"""The README.md model card a published HiRes checkpoint carries: Hub metadata, architecture, cost, usage.

The YAML block is what the Hub indexes (library, pipeline, tags, licence, base model, datasets, model-index);
the body is what a reader needs to decide whether the model fits: d, D, k, blocks, experts and the counted
FLOPs per token next to the vanilla twin's (hires_hf.accounting), and a snippet that loads it with remote code.

Provenance comes from the config when the tools that made the checkpoint recorded it [project choice]:
- `config.hires_conversion = {"base_model": "<hub id of the converted checkpoint>", ...}` (written by conversion),
- `config.hires_training = {"datasets": ["<hub dataset id>", ...], ...}` (written by training);
explicit arguments override both.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .accounting import cost, hires_flops_overhead
from .configuration_hires import HiResConfig
from .errors import HiResUserError
from .tables import markdown_table

DEFAULT_LICENSE = "other"  # the weights' licence is the publisher's call; "other" is valid Hub metadata
CARD_CONTEXT = 2048  # context length at which the card counts attention FLOPs (capped at the model's maximum)


def provenance(config: HiResConfig) -> tuple[str | None, list[str]]:
    """Base model and training datasets recorded in the config by conversion / training, if any."""
    conversion = getattr(config, "hires_conversion", None) or {}
    training = getattr(config, "hires_training", None) or {}
    base_model = conversion.get("base_model") if isinstance(conversion, dict) else None
    datasets = training.get("datasets", []) if isinstance(training, dict) else []
    return base_model, [datasets] if isinstance(datasets, str) else list(datasets)


def eval_results_from_lm_eval(path: str | Path, model: str | Path | None = None) -> list[EvalResult]:
    """model-index entries from an lm-eval results JSON (`simple_evaluate` output or `--output_path` file), or from
    `hires-hf eval --out`'s file, which holds one such report a model: `model`'s (the folder being published)."""
    path = _results_file(Path(path))
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise HiResUserError(f"{path} is not valid JSON ({error}); pass the results file lm-eval wrote.") from error
    if isinstance(report, dict) and isinstance(report.get("models"), dict):
        report = _model_report(path, report["models"], model)
    if not isinstance(report, dict) or not isinstance(report.get("results"), dict):
        raise HiResUserError(f"{path} has no 'results' mapping; pass the results JSON written by lm-eval.")
    configs, shots = report.get("configs", {}), report.get("n-shot", {})
    entries = []
    for task, metrics in sorted(report["results"].items()):
        dataset = _hub_dataset(configs.get(task, {})) or task
        for key, value in sorted(metrics.items()):
            metric, _, filter_name = key.partition(",")
            if "_stderr" in metric or not _is_number(value):
                continue
            entries.append(
                EvalResult(
                    task_type="text-generation",
                    task_name=task,
                    dataset_type=dataset,
                    dataset_name=metrics.get("alias", task).strip(" -"),
                    dataset_args={"num_few_shot": shots[task]} if task in shots else None,
                    metric_type=metric,
                    metric_name=metric if filter_name in ("", "none") else f"{metric} ({filter_name})",
                    metric_value=round(float(value), 4),
                    source_name="lm-evaluation-harness",
                    source_url="https://github.com/EleutherAI/lm-evaluation-harness",
                )
            )
    if not entries:
        raise HiResUserError(f"{path} holds no numeric metrics; pass an lm-eval results JSON with scores.")
    return entries


def _model_report(path: Path, reports: dict[str, Any], model: str | Path | None) -> Any:
    """`model`'s report in a `hires-hf eval` file (keyed by the paths or ids it was given); the only one if one."""
    if len(reports) == 1:
        return next(iter(reports.values()))
    if model is not None:
        wanted = Path(model).resolve()
        for name, report in reports.items():
            if Path(name).resolve() == wanted:
                return report
    raise HiResUserError(
        f"{path} holds the results of {len(reports)} models ({', '.join(reports)}) and none is {model}; "
        "evaluate the published folder alone (hires-hf eval FOLDER --out FILE) or pass lm-eval's own results file."
    )


def _results_file(path: Path) -> Path:
    """lm-eval's `--output_path DIR` nests `results_<time>.json` under a model folder: take the newest."""
    if path.is_dir():
        found = sorted(path.rglob("results*.json"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise HiResUserError(f"no results*.json under {path}; pass the file lm-eval wrote.")
        return found[-1]
    if not path.is_file():
        raise HiResUserError(f"results file {path} does not exist; pass the JSON written by lm-eval.")
    return path


def _hub_dataset(task_config: dict[str, Any]) -> str | None:
    """The task's Hub dataset id; local tasks (`dataset_path: json` or a path) have none."""
    dataset = task_config.get("dataset_path")
    if not isinstance(dataset, str) or dataset in ("json", "csv", "text", "parquet") or Path(dataset).exists():
        return None
    return dataset


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def card_data(
    config: HiResConfig,
    repo_id: str,
    *,
    license: str = DEFAULT_LICENSE,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    eval_results: list[EvalResult] | None = None,
) -> ModelCardData:
    """The YAML metadata the Hub indexes."""
    tags = ["hires", "hierarchical-residuals", "text-generation", "custom_code"]
    if config.is_moe:
        tags.append("moe")
    return ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        license=license,
        tags=tags,
        base_model=base_model,
        datasets=datasets or None,
        model_name=repo_id.split("/")[-1],
        eval_results=eval_results or None,
    )


def architecture_table(config: HiResConfig, seq_len: int = CARD_CONTEXT) -> str:
    """HiRes hyper-parameters and counted costs, next to the vanilla twin's (same layers, no wide stream)."""
    seq_len = min(seq_len, config.max_position_embeddings)
    hires, vanilla = cost(config, seq_len), cost(config, seq_len, vanilla=True)
    experts = (
        f"{config.num_experts}, top-{config.num_experts_per_tok}, width {config.moe_intermediate_size}"
        if config.is_moe
        else f"dense (SwiGLU width {config.intermediate_size})"
    )
    rows = [
        ("compute width d (`hidden_size`)", f"{config.hidden_size}"),
        ("residual width D (`residual_size`)", f"{config.residual_size}"),
        ("layers L", f"{config.num_hidden_layers}"),
        ("layers per block k", f"{config.layers_per_block}"),
        ("blocks B = L / k", f"{config.num_blocks}"),
        ("experts (E, top-K, expert width)", experts),
        (
            "attention heads / kv heads / head dim",
            f"{config.num_attention_heads} / {config.num_key_value_heads} / {config.head_dim}",
        ),
        ("write mode / outer norm", f"{config.write_mode} / {'on' if config.outer_norm else 'off'}"),
        ("vocabulary / max context", f"{config.vocab_size} / {config.max_position_embeddings}"),
        ("parameters (vanilla twin)", f"{hires.params:,} ({vanilla.params:,})"),
        (
            f"forward FLOPs/token at {seq_len} tokens (vanilla twin)",
            f"{hires.forward_flops_per_token:,.0f} ({vanilla.forward_flops_per_token:,.0f}, "
            f"HiRes {hires_flops_overhead(config, seq_len):+.2%})",
        ),
    ]
    return "\n".join(markdown_table(["", ""], rows))


def usage_snippet(repo_id: str, revision: str | None = None) -> str:
    """Loading with remote code: the folder carries configuration_hires.py and modeling_hires.py.

    The tokenizer is a plain fast tokenizer, yet its call needs the flag too: `AutoTokenizer` (transformers 5)
    always reads config.json first, and a model type transformers does not know makes it ask, on the
    terminal, whether to run the repo's code (and warn when refused). With the flag it only runs the config
    class, silently. (tests/test_publish.py runs this snippet without hires_hf and checks it stays quiet.)
    """
    extra = f', revision="{revision}"' if revision else ""
    return f"""```python
from transformers import AutoModelForCausalLM, AutoTokenizer

# trust_remote_code: config.json names the `hires` architecture, whose code ships in this repo;
# AutoTokenizer reads that config too (the tokenizer itself is a plain fast tokenizer).
tokenizer = AutoTokenizer.from_pretrained("{repo_id}"{extra}, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained("{repo_id}"{extra}, trust_remote_code=True)

inputs = tokenizer("def fibonacci(n):", return_tensors="pt")
print(tokenizer.decode(model.generate(**inputs, max_new_tokens=32)[0]))
```

With `pip install hires-hf`, `import hires_hf` registers the architecture and `trust_remote_code` is not needed."""


def _results_table(results: list[EvalResult]) -> str:
    rows = [
        (r.task_name, r.metric_name, f"{r.metric_value:.4f}", (r.dataset_args or {}).get("num_few_shot", ""))
        for r in results
    ]
    return "\n".join(markdown_table(["task", "metric", "value", "few-shot"], rows, align="llrr"))


def build_model_card(
    config: HiResConfig,
    repo_id: str,
    *,
    revision: str | None = None,
    license: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    results: str | Path | None = None,
    model: str | Path | None = None,
) -> ModelCard:
    """The whole card; arguments left as None fall back to what the config recorded (see module docstring).
    `model` is the folder being published: it picks its scores out of a `hires-hf eval` file of several models."""
    recorded_base, recorded_datasets = provenance(config)
    base_model = base_model or recorded_base
    datasets = datasets or recorded_datasets
    eval_results = eval_results_from_lm_eval(results, model) if results is not None else []
    data = card_data(
        config,
        repo_id,
        license=license or DEFAULT_LICENSE,
        base_model=base_model,
        datasets=datasets,
        eval_results=eval_results,
    )
    kind = "mixture-of-experts" if config.is_moe else "dense"
    sections = [
        f"# {repo_id.split('/')[-1]}",
        f"A {kind} **HiRes** (Hierarchical Residuals) causal language model. Every layer computes at width "
        f"d = {config.hidden_size}; between blocks of k = {config.layers_per_block} layers the residual stream is "
        f"D = {config.residual_size} wide, joined by learned read (D -> d) and write (d -> D) projections"
        + (" and a PostNorm outer residual." if config.outer_norm else "."),
    ]
    if base_model:
        sections.append(f"Converted from [`{base_model}`](https://huggingface.co/{base_model}).")
    if datasets:
        sections.append("Trained on: " + ", ".join(f"`{name}`" for name in datasets) + ".")
    sections += [
        "## Architecture",
        architecture_table(config),
        "The vanilla twin has the same d-wide layers and no wide stream; the baseline a quality claim must beat is "
        "that twin with HiRes's embedding scale (the same cost). `hires-hf compare --model <this folder's "
        "config.json> --data <your data>` trains both at matched counted FLOPs, each at its own bracketed "
        "learning rate, and prints which wins.",
    ]
    sections += ["## Usage", usage_snippet(repo_id, revision)]
    if eval_results:
        sections += ["## Evaluation", "Scores from lm-evaluation-harness:", _results_table(eval_results)]
    if not license:
        sections += ["## Licence", "No licence was given at publishing time (`--license`); ask the publisher."]
    body = "\n\n".join(sections)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}\n")


__all__ = [
    "architecture_table",
    "build_model_card",
    "card_data",
    "eval_results_from_lm_eval",
    "provenance",
    "usage_snippet",
]
