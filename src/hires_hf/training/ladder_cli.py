"""`hires-hf ladder`: argument parsing and messages only; the work is in ladder.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import HiResUserError
from .ladder import LadderSettings, run_ladder, settings_with


def run_ladder_command(args: argparse.Namespace) -> int:
    base = LadderSettings.smoke() if args.smoke else LadderSettings()
    settings = settings_with(
        base,
        sizes=tuple(args.sizes) if args.sizes else None,
        seeds=args.seeds,
        budget_minutes=args.budget_minutes,
        width_factor=args.width_factor,
        layers_per_block=args.layers_per_block,
        vocab_size=args.vocab_size,
        block_size=args.block_size,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        hires_learning_rate=args.hires_lr,
        threads=args.threads,
    )
    for name in ("block_size", "batch_size", "threads"):
        if getattr(settings, name) < 1:
            raise HiResUserError(f"--{name.replace('_', '-')} must be at least 1; got {getattr(settings, name)}.")
    records = run_ladder(settings, args.out, progress=not args.quiet)
    print(f"wrote {len(records)} runs to {args.out}; fit them with: hires-hf scaling {args.out}")
    return 0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    defaults = LadderSettings()
    parser = subparsers.add_parser(
        "ladder",
        help="train HiRes and its vanilla twin at several sizes (equal counted FLOPs per size); writes a RUNS file",
        description="Each size gets one counted-FLOPs budget that HiRes and its vanilla twin both spend (HiRes "
        "sees fewer tokens); budgets grow with the square of the size's FLOPs per token and are scaled to fit "
        "--budget-minutes of wall clock. Data: the Python standard library, one shared BPE tokenizer.",
    )
    parser.add_argument(
        "--budget-minutes", type=float, help=f"wall clock for the whole ladder (default {defaults.budget_minutes:g})"
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        metavar="SIZE",
        help=f"DxL (width x layers, e.g. 64x4) or preset names (default: {' '.join(defaults.sizes)})",
    )
    parser.add_argument("--seeds", type=int, help=f"runs per size and architecture (default {defaults.seeds})")
    parser.add_argument("--out", type=Path, default=Path("runs/ladder/runs.jsonl"), help="the RUNS file (JSONL)")
    parser.add_argument("--smoke", action="store_true", help="a seconds-long ladder (tiny sizes, data and steps)")
    shape = parser.add_argument_group("shape of DxL sizes")
    shape.add_argument("--width-factor", type=int, help=f"D / d (default {defaults.width_factor})")
    shape.add_argument("--layers-per-block", type=int, help=f"k (default {defaults.layers_per_block})")
    train = parser.add_argument_group("training")
    train.add_argument("--vocab-size", type=int, help=f"shared BPE vocabulary (default {defaults.vocab_size})")
    train.add_argument("--block-size", type=int, help=f"tokens per block (default {defaults.block_size})")
    train.add_argument("--batch-size", type=int, help=f"blocks per step (default {defaults.batch_size})")
    train.add_argument("--lr", type=float, help=f"peak learning rate (default {defaults.learning_rate:g})")
    train.add_argument("--hires-lr", type=float, help="HiRes's own peak learning rate (default: --lr for both)")
    train.add_argument(
        "--threads", type=int, help="torch CPU threads (default 1: fastest for tiny models on a shared CPU)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_ladder_command)


__all__ = ["add_parsers", "run_ladder_command"]
