"""`hires-hf eval`, `hires-hf perplexity` and `hires-hf scaling`: argument parsing and messages only."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import HiResUserError
from .harness import OFFLINE_TASKS


def _task_list(value: str) -> list[str]:
    tasks = [task.strip() for task in value.split(",") if task.strip()]
    if not tasks:
        raise argparse.ArgumentTypeError("give at least one task name")
    return tasks


def _limit(value: str) -> int | float:
    """lm-eval takes a count of docs per task, or a fraction below 1."""
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return number if number < 1 else int(number)


def run_eval(args: argparse.Namespace) -> int:
    from .harness import check_model, evaluate, results_table, task_manager, write_results

    tasks = [task for group in args.tasks for task in group] if args.tasks else list(OFFLINE_TASKS)
    manager = task_manager(tasks, args.include_path or ())
    for model in args.models:
        check_model(model, args.trust_remote_code)
    results = {}
    for model in args.models:
        results[model] = evaluate(
            model,
            tasks,
            manager,
            limit=args.limit,
            batch_size=args.batch_size,
            num_fewshot=args.num_fewshot,
            device=args.device,
            dtype=args.dtype,
            trust_remote_code=args.trust_remote_code,
            bootstrap_iters=args.bootstrap_iters,
        )
    table = results_table(results)
    print(table)
    if args.out:
        json_path, markdown_path = write_results(Path(args.out), results, table)
        print(f"\nwrote {json_path} and {markdown_path}")
    return 0


def run_perplexity(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..io import write_json_atomic
    from .harness import check_model
    from .perplexity import sliding_window_perplexity

    for name in ("window", "stride", "batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise HiResUserError(f"--{name.replace('_', '-')} must be at least 1.")
    if args.window and args.stride and args.stride > args.window:
        raise HiResUserError(f"--stride {args.stride} exceeds --window {args.window}; every token must be scored.")
    text_path = Path(args.file)
    if not text_path.is_file():
        raise HiResUserError(f"text file {args.file!r} does not exist.")
    try:
        text = text_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise HiResUserError(f"{args.file} is not UTF-8 text ({error.reason}).") from error
    check_model(args.model, args.trust_remote_code)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, trust_remote_code=args.trust_remote_code)
    model.to(device).eval()
    if args.window and args.window > model.config.max_position_embeddings:
        raise HiResUserError(
            f"--window {args.window} exceeds the model's context ({model.config.max_position_embeddings} tokens)."
        )
    result = sliding_window_perplexity(model, tokenizer, text, args.window, args.stride, batch_size=args.batch_size)
    print(
        f"{args.file}: {result.tokens} tokens, window {result.window}, stride {result.stride}: "
        f"perplexity {result.perplexity:.4f}, bits/byte {result.bits_per_byte:.4f}, "
        f"word perplexity {result.word_perplexity:.4f}"
    )
    if args.out:
        write_json_atomic(Path(args.out), {"model": args.model, "file": args.file, **result.as_dict()}, indent=None)
    return 0


def run_scaling(args: argparse.Namespace) -> int:
    from ..io import write_json_atomic
    from .scaling import analyse, plot_fits, read_runs, report_table

    if args.bootstrap < 0:
        raise HiResUserError("--bootstrap must be 0 (no interval) or a positive number of resamples.")
    runs = read_runs(args.runs)
    report = analyse(
        runs,
        baseline=args.baseline,
        irreducible=args.irreducible,
        at_compute=args.at_compute,
        at_loss=args.at_loss,
        bootstrap=args.bootstrap,
        seed=args.seed,
    )
    out_dir = Path(args.out_dir or Path(args.runs).parent)
    write_json_atomic(out_dir / "scaling_fit.json", report.as_dict())
    plot = plot_fits(report, out_dir / "scaling_fit.png")
    print(report_table(report))
    if not report.multipliers:
        print(f"\nno {args.baseline!r} runs: fits only (set the baseline architecture with --baseline).")
    print(f"\nwrote {out_dir / 'scaling_fit.json'} and {plot}")
    return 0


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"), help="weights dtype"
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run a folder's own modeling code (not needed for HiRes: hires_hf registers it)",
    )


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval", help="lm-eval-harness on one or more model folders / Hub ids, side by side in one table"
    )
    parser.add_argument("models", nargs="+", metavar="MODEL", help="model folder or Hub id (several: compared)")
    parser.add_argument(
        "--tasks",
        type=_task_list,
        action="append",
        default=None,
        help=f"comma-separated lm-eval task names (default: the offline {', '.join(OFFLINE_TASKS)})",
    )
    parser.add_argument("--include-path", action="append", metavar="DIR", help="folder of extra task YAMLs")
    parser.add_argument("--limit", type=_limit, default=None, help="docs per task (or a fraction < 1)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-fewshot", type=int, default=None)
    parser.add_argument("--bootstrap-iters", type=int, default=1000, help="resamples for stderr (0: none)")
    parser.add_argument("--out", metavar="FILE", help="write the full results JSON here and the table to FILE.md")
    _add_model_options(parser)
    parser.set_defaults(func=run_eval)

    parser = subparsers.add_parser("perplexity", help="sliding-window perplexity of a model on a text file")
    parser.add_argument("model", metavar="MODEL", help="model folder or Hub id")
    parser.add_argument("file", metavar="FILE", help="UTF-8 text file")
    parser.add_argument("--window", type=int, default=None, help="tokens per forward pass (default: model context)")
    parser.add_argument(
        "--stride", type=int, default=None, help="new tokens scored per window (default: window, as lm-eval)"
    )
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--out", metavar="FILE", help="also write the numbers as JSON")
    _add_model_options(parser)
    parser.set_defaults(func=run_perplexity)

    parser = subparsers.add_parser("scaling", help="fit L(C) per architecture; FLOPs-efficiency multiplier + PNG")
    parser.add_argument("runs", metavar="RUNS", help="JSON/JSONL of {arch, params, flops, loss} records")
    parser.add_argument("--out-dir", default=None, help="where scaling_fit.json / .png go (default: next to RUNS)")
    parser.add_argument("--baseline", default="vanilla", help="architecture the multipliers are relative to")
    parser.add_argument("--irreducible", action="store_true", help="fit L = A*C^-alpha + E (needs >= 3 sizes)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--at-compute", type=float, help="multiplier at this compute (default: largest run)")
    where.add_argument("--at-loss", type=float, help="multiplier at this loss")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resamples for the confidence interval")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run_scaling)
