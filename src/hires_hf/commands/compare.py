"""`hires-hf compare`: argument parsing and the printed verdict; the work is in `hires_hf.experiments.compare`."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from ..errors import HiResUserError
from ..experiments.compare import CompareSettings, compare, table


def run_compare(args: argparse.Namespace) -> int:
    budgets = (args.budget_minutes, args.budget_flops, args.budget_tokens)
    if any(budget is not None and budget <= 0 for budget in budgets):
        raise HiResUserError("--budget-minutes, --budget-flops and --budget-tokens must be positive.")
    for name in ("context", "batch_size", "seeds"):
        if getattr(args, name) < 1:
            raise HiResUserError(f"--{name.replace('_', '-')} must be at least 1; got {getattr(args, name)}.")
    settings = CompareSettings(
        data=tuple(args.data),
        model=args.model,
        vocab_size=args.vocab_size,
        budget_minutes=args.budget_minutes,
        budget_flops=args.budget_flops,
        budget_tokens=args.budget_tokens,
        rates=tuple(sorted(args.lrs)),
        seeds=args.seeds,
        plain_twin=args.plain_twin,
        context=args.context,
        batch_size=args.batch_size,
        max_chars=args.max_chars,
        device=args.device,
        threads=args.threads,
        precision=args.precision,
    )
    if args.smoke:  # tiny data, steps and grid; an explicit --budget-flops still counts (tests of its check)
        settings = replace(
            settings,
            budget_flops=args.budget_flops or (None if args.budget_tokens else 3e9),
            rates=(2e-3, 4e-3),
            context=32,
            batch_size=4,
            max_chars=200_000,
            eval_blocks=4,
            evaluations=2,
            device="cpu",
        )
    summary = compare(settings, args.out, progress=not args.quiet)
    print(table(summary))
    print(summary["verdict"]["line"])
    if args.out is not None:
        print(f"Wrote {args.out}/compare.json, loss_vs_flops.png and the best model of each architecture.")
    return 0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="does HiRes pay on your data? HiRes vs the scaled-embedding Llama control at matched counted FLOPs",
        description="HiRes (--model) and the control (its Llama twin with HiRes's embedding scale, the strongest "
        "simple vanilla; --plain-twin adds the plain Llama twin) train on your data for the same counted FLOPs per "
        "run, each over its own learning-rate grid extended by x2 until its best rate is bracketed, then --seeds "
        "seeds at each best rate. Prints one verdict line.",
    )
    d = CompareSettings()  # every default below is the library's
    parser.add_argument(
        "--data", nargs="+", default=list(d.data), help="jsonl / text files or folders, 'stdlib' or 'python'"
    )
    parser.add_argument(
        "--model", default=d.model, help="a HiRes preset, a shape DxL (e.g. 128x16), or a config.json / model folder"
    )
    parser.add_argument("--vocab-size", type=int, help="tokenizer and model vocabulary (default: the config's)")
    parser.add_argument("--budget-minutes", type=float, default=d.budget_minutes, help="wall clock for all runs")
    parser.add_argument("--budget-flops", type=float, help="counted training FLOPs per run (overrides the minutes)")
    parser.add_argument("--budget-tokens", type=float, help="per run: the FLOPs of this many control tokens")
    parser.add_argument("--lrs", type=float, nargs="+", default=list(d.rates), help="the starting LR grid")
    parser.add_argument("--seeds", type=int, default=d.seeds, help=f"seeds at each best rate (default {d.seeds})")
    parser.add_argument("--plain-twin", action="store_true", help="also train the plain transformers Llama twin")
    parser.add_argument("--context", type=int, default=d.context, help=f"tokens per block (default {d.context})")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help=f"blocks a step (default {d.batch_size})")
    parser.add_argument("--max-chars", type=int, default=d.max_chars, help="read at most this much text")
    parser.add_argument("--device", default=d.device, help="cuda when there is one, else cpu")
    parser.add_argument(
        "--precision",
        default=d.precision,
        choices=("auto", "bf16", "fp32"),
        help="auto: bf16 autocast where bf16 matmuls are native (CUDA, CPUs with AMX / AVX512-BF16), else fp32",
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, help="folder for compare.json, loss_vs_flops.png and the best models")
    parser.add_argument("--smoke", action="store_true", help="a seconds-long comparison (tiny data and budget)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_compare)
