"""lm-eval-harness glue: evaluate one or several model folders (or Hub ids) on tasks, side by side.

`import hires_hf` registers HiRes with the Auto classes, so lm-eval's own `hf` model (HFLM) loads a HiRes
folder without remote code; the offline tasks shipped in `tasks/` are always on the include path. lm-eval is
the optional `eval` extra and is imported only when evaluating.
"""

from __future__ import annotations

import difflib
import logging
import re
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from ..errors import HiResUserError  # importing hires_hf.* runs hires_hf/__init__, which registers HiRes
from ..io import write_json_atomic, write_text_atomic
from ..tables import markdown_table

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
OFFLINE_TASKS = ("stdlib_next_line", "stdlib_perplexity")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def _require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ModuleNotFoundError as error:
        raise HiResUserError("lm-eval is not installed; install it with `pip install 'hires-hf[eval]'`.") from error


def check_model(spec: str, trust_remote_code: bool = False) -> None:
    """Fail early, in one line, on a model that cannot be evaluated: no such folder, no config, no tokenizer."""
    from transformers import AutoTokenizer

    path = Path(spec)
    if not path.exists():
        if spec.startswith((".", "/", "~")) or not _HUB_ID.match(spec):
            raise HiResUserError(f"model folder {spec!r} does not exist.")
    elif not (path / "config.json").is_file():
        raise HiResUserError(f"{spec} has no config.json; pass a folder written by save_pretrained.")
    elif not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise HiResUserError(
            f"model folder {spec} has no tokenizer ({' / '.join(_TOKENIZER_FILES[:2])}); "
            "save one next to the weights with tokenizer.save_pretrained(FOLDER)."
        )
    try:
        AutoTokenizer.from_pretrained(spec, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as error:
        reason = str(error).splitlines()[0]
        if path.exists():
            fix = "save one next to the weights with tokenizer.save_pretrained(FOLDER)."
            raise HiResUserError(f"cannot load a tokenizer from folder {spec!r} ({reason}); {fix}") from error
        fix = "check the id, or download it while online (HF_HUB_OFFLINE=1 forbids downloads)."
        raise HiResUserError(f"cannot load {spec!r} as a Hub id ({reason}); {fix}") from error


def task_manager(tasks: Sequence[str], include_paths: Sequence[str | Path] = ()) -> Any:
    """An lm-eval TaskManager that knows `tasks`: the offline ones plus `include_paths`, lm-eval's own if needed.

    Indexing lm-eval's ~15k built-in tasks takes ~10 s, so they are only indexed when a task is not local.
    """
    _require_lm_eval()
    from lm_eval.tasks import TaskManager

    for path in include_paths:
        if not Path(path).is_dir():
            raise HiResUserError(f"include path {str(path)!r} is not a folder; pass a folder of lm-eval task YAMLs.")
    paths = [TASKS_DIR, *map(Path, include_paths)]
    manager = TaskManager(include_path=paths, include_defaults=False)
    if all(task in manager.all_tasks for task in tasks):
        return manager
    manager = TaskManager(include_path=paths, include_defaults=True)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        hints = difflib.get_close_matches(unknown[0], manager.all_tasks, n=3)
        hint = f" Did you mean {', '.join(hints)}?" if hints else ""
        raise HiResUserError(
            f"unknown task {unknown[0]!r}.{hint} Offline tasks: {', '.join(OFFLINE_TASKS)}; "
            "add your own YAMLs with --include-path DIR."
        )
    return manager


def evaluate(
    model: str,
    tasks: Sequence[str],
    manager: Any,
    *,
    limit: int | float | None = None,
    batch_size: int = 8,
    num_fewshot: int | None = None,
    device: str | None = None,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    bootstrap_iters: int = 1000,
    progress: bool = True,
) -> dict[str, Any]:
    """One model's lm-eval results (the dict `simple_evaluate` returns, without per-sample logs).

    `progress=False` drops lm-eval's and transformers' progress bars (about ten a model: building requests,
    tokenizing, loading weights, running requests), for callers that show one bar of their own.
    """
    import lm_eval
    import torch

    model_args = {
        "pretrained": model,
        "dtype": dtype,
        "trust_remote_code": trust_remote_code,
        "backend": _backend(model, trust_remote_code),
    }
    with quiet_lm_eval(progress):
        results = lm_eval.simple_evaluate(
            model="hf",
            model_args=model_args,
            tasks=list(tasks),
            num_fewshot=num_fewshot,
            batch_size=batch_size,
            device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
            limit=limit,
            bootstrap_iters=bootstrap_iters,
            log_samples=False,
            task_manager=manager,
        )
    if results is None:  # only non-zero ranks of a distributed run get None
        return {}
    results.pop("samples", None)
    return results


def _backend(model: str, trust_remote_code: bool) -> str:
    """The lm-eval backend: "causal" for a causal LM its name tables miss, else lm-eval's own choice ("default").

    lm-eval tells causal from seq2seq models by transformers' static lists of model types, which cannot hold an
    architecture registered at run time such as HiRes; it then warns that the type is unknown and guesses
    causal. Saying so ourselves keeps the answer and drops the warning.
    """
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    try:
        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return "default"  # lm-eval loads it itself and reports the problem
    known = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.keys() | MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.keys()
    registered_causal = type(config) in MODEL_FOR_CAUSAL_LM_MAPPING
    return "causal" if config.model_type not in known and registered_causal else "default"


# lm-eval's advice to pass `--metadata` on its own command line, logged for every task with a custom loader
# (ours, and any --include-path task built the same way); `hires-hf eval` has no such option.
_METADATA_ADVICE = "Custom kwargs can be passed to `--metadata`"
# transformers' warning when a text encodes to more tokens than the tokenizer's model_max_length: lm-eval encodes
# whole documents on purpose and cuts them into windows of the model's length itself (loglikelihood_rolling).
_TOO_LONG_WARNING = "Token indices sequence length is longer than the specified maximum"
# the lm-eval modules whose loops draw progress bars with tqdm, whatever the caller asks
_LM_EVAL_BAR_MODULES = ("lm_eval.api.task", "lm_eval.api.model", "lm_eval.models.huggingface")


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def _git_commit_quietly() -> str | None:
    """What lm-eval records as `git_hash`, without letting git's 'fatal: not a git repository' reach the terminal."""
    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


@contextmanager
def quiet_lm_eval(progress: bool = True) -> Iterator[None]:
    """While our lm-eval calls run, drop what is no news to our users, and only that: the `--metadata` advice,
    git's complaint when the working directory is not a repository, and transformers' too-long-sequence warning
    (lm-eval windows long documents itself); with `progress=False`, every progress bar too. Real warnings (a
    task's bad label, a few-shot split missing) still show; the results table is what remains on screen."""
    import lm_eval.evaluator

    filtered = [
        (logging.getLogger("lm_eval.api.task"), _DropMessages(_METADATA_ADVICE)),
        (logging.getLogger("transformers.tokenization_utils_base"), _DropMessages(_TOO_LONG_WARNING)),
    ]
    for logger, noise in filtered:
        logger.addFilter(noise)
    original = getattr(lm_eval.evaluator, "get_git_commit_hash", None)
    if original is not None:
        lm_eval.evaluator.get_git_commit_hash = _git_commit_quietly
    try:
        with nullcontext() if progress else _no_progress_bars():
            yield
    finally:
        for logger, noise in filtered:
            logger.removeFilter(noise)
        if original is not None:
            lm_eval.evaluator.get_git_commit_hash = original


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """No bars from lm-eval's loops (their `tqdm` calls take no switch from `simple_evaluate`, so each module's
    `tqdm` is swapped for a disabled one) nor from transformers (loading weights)."""
    import importlib

    from tqdm import tqdm

    def disabled(*args: Any, **kwargs: Any) -> tqdm:
        return tqdm(*args, **{**kwargs, "disable": True})

    modules = [importlib.import_module(name) for name in _LM_EVAL_BAR_MODULES]
    originals = [module.tqdm for module in modules]
    for module in modules:
        module.tqdm = disabled
    try:
        with no_transformers_bars():
            yield
    finally:
        for module, original in zip(modules, originals):
            module.tqdm = original


@contextmanager
def no_transformers_bars() -> Iterator[None]:
    """transformers' own progress bars (loading weights, writing model shards) off through its switch, then back
    as they were; the Trainer's bar is not one of them."""
    from transformers.utils import logging as transformers_logging

    bars_were_on = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars_were_on:
            transformers_logging.enable_progress_bar()


def _metrics(task_results: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(metric, value, stderr) for one task; lm-eval keys them 'metric,filter' and 'metric_stderr,filter'."""
    rows = []
    for key, value in task_results.items():
        if "," not in key or "_stderr," in key:
            continue
        metric, filter_name = key.split(",", 1)
        stderr = task_results.get(f"{metric}_stderr,{filter_name}")
        name = metric if filter_name == "none" else f"{metric} ({filter_name})"
        rows.append((name, value, stderr))
    return rows


def _number(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:,.0f}"  # 20,140,000 rather than 2.014e+07
    return "" if value in (None, "N/A") else str(value)


def model_labels(models: Sequence[str]) -> list[str]:
    """Short column names: the folder's name, or the whole spec where two names would collide."""
    names = [Path(model.rstrip("/")).name or model for model in models]
    return [name if names.count(name) == 1 else model for name, model in zip(names, models)]


def results_table(results_by_model: dict[str, dict[str, Any]]) -> str:
    """A markdown table: one row per (task, metric), a value and a stderr column per model."""
    models = list(results_by_model)
    labels = model_labels(models)
    found: dict[tuple[str, str], dict[str, tuple[Any, Any]]] = {}
    for model in models:
        for task, task_results in results_by_model[model].get("results", {}).items():
            for metric, value, stderr in _metrics(task_results):
                found.setdefault((task, metric), {})[model] = (value, stderr)
    header = ["task", "metric"]
    for label in labels:
        header += [label, "stderr"] if len(models) > 1 else ["value", "stderr"]
    rows = []
    for (task, metric), by_model in found.items():
        pairs = [by_model.get(model, (None, None)) for model in models]
        rows.append([task, metric, *(_number(number) for pair in pairs for number in pair)])
    return "\n".join(markdown_table(header, rows, align="ll" + "rr" * len(models)))


def write_results(out: Path, results_by_model: dict[str, dict[str, Any]], table: str) -> tuple[Path, Path]:
    """The full results as JSON at `out` and the table as markdown next to it (same name, `.md`)."""
    from lm_eval.utils import handle_non_serializable

    markdown = out.with_suffix(".md")
    write_json_atomic(out, {"models": results_by_model}, default=handle_non_serializable)
    write_text_atomic(markdown, table + "\n")
    return out, markdown


__all__ = [
    "OFFLINE_TASKS",
    "TASKS_DIR",
    "check_model",
    "evaluate",
    "model_labels",
    "no_transformers_bars",
    "quiet_lm_eval",
    "results_table",
    "task_manager",
    "write_results",
]
