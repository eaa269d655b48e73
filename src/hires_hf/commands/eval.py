"""`hires-hf eval`: lm-eval-harness on one or more models, side by side in one table; the work is in `hires_hf.eval`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..eval.harness import OFFLINE_TASKS, check_model, evaluate, results_table, task_manager, write_results
from . import add_model_options, default


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
    parser.add_argument("--batch-size", type=int, default=default(evaluate, "batch_size"))
    parser.add_argument("--num-fewshot", type=int, default=None)
    parser.add_argument(
        "--bootstrap-iters",
        type=int,
        default=default(evaluate, "bootstrap_iters"),
        help="resamples for stderr (0: none)",
    )
    parser.add_argument(
        "--out", metavar="FILE", help="write the full results JSON here and the table beside it with a .md suffix"
    )
    add_model_options(parser)
    parser.set_defaults(func=run_eval)
