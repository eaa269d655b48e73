"""`hires-hf ladder`: argument parsing and messages only; the work is in ladder.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import HiResUserError
from .ladder import MIN_STEPS, LadderSettings, run_ladder, settings_with


def run_ladder_command(args: argparse.Namespace) -> int:
    base = {"cpu": LadderSettings, "gpu": LadderSettings.gpu}[args.preset]()
    if args.smoke:
        base = LadderSettings.smoke(**({"lr_sweep": (1e-3, 3e-3), "moe_size": "32x2"} if args.preset == "gpu" else {}))
    fixed_rate = (args.lr is not None or args.hires_lr is not None) and not args.lr_sweep
    settings = settings_with(
        base,
        sizes=tuple(args.sizes) if args.sizes else None,
        seeds=args.seeds,
        budget_minutes=args.budget_minutes,
        width_factor=args.width_factor,
        layers_per_block=args.layers_per_block,
        head_dim=args.head_dim,
        vocab_size=args.vocab_size,
        block_size=args.block_size,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        hires_learning_rate=args.hires_lr,
        plain_twin=args.plain_twin or None,
        lr_sweep=tuple(args.lr_sweep) if args.lr_sweep else () if fixed_rate else None,  # --lr: no sweep
        moe_size=args.moe_size,
        corpus=args.corpus,
        max_chars=args.max_chars,
        threads=args.threads,
        device=args.device,
    )
    for name in ("block_size", "batch_size", "threads", "head_dim"):
        if getattr(settings, name) < 1:
            raise HiResUserError(f"--{name.replace('_', '-')} must be at least 1; got {getattr(settings, name)}.")
    records = run_ladder(settings, args.out, progress=not args.quiet)
    print(f"wrote {len(records)} runs to {args.out}; fit them with: hires-hf scaling {args.out}")
    return 0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    defaults = LadderSettings()
    parser = subparsers.add_parser(
        "ladder",
        help="train HiRes and the vanilla control at several sizes (equal counted FLOPs per size); writes a RUNS file",
        description="Each size gets one counted-FLOPs budget that HiRes and the baseline both spend (HiRes sees "
        "fewer tokens). The baseline ('vanilla' in the RUNS file) is the control: the Llama twin with HiRes's "
        "embedding scale; --plain-twin adds transformers' twin as it ships. Budgets grow with the square of the "
        "size's FLOPs per token and are scaled to fit --budget-minutes of wall clock, from synchronised step "
        "timings on the training device (CUDA when there is one, bf16 autocast). Each architecture's learning "
        f"rate: a sweep at the smallest size, extended until its best is bracketed, carried up unchanged and "
        f"checked one size up (runs of at least {MIN_STEPS} steps, else refused). --preset gpu: four rungs of "
        "~6M-110M parameters, 2 seeds at the two smallest rungs and an MoE point, in ~9 minutes of one H200.",
    )
    parser.add_argument("--preset", choices=("cpu", "gpu"), default="cpu", help="the ladder's shape (default cpu)")
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
    shape.add_argument("--head-dim", type=int, help=f"dims per attention head (default {defaults.head_dim})")
    shape.add_argument("--moe-size", help="DxL of one extra MoE point (HiRes-MoE vs its OLMoE twin)")
    train = parser.add_argument_group("training")
    train.add_argument("--vocab-size", type=int, help=f"shared BPE vocabulary (default {defaults.vocab_size})")
    train.add_argument("--block-size", type=int, help=f"tokens per block (default {defaults.block_size})")
    train.add_argument("--batch-size", type=int, help=f"blocks per step (default {defaults.batch_size})")
    train.add_argument("--lr", type=float, help="one peak learning rate for every architecture, no sweep")
    train.add_argument("--hires-lr", type=float, help="HiRes's own peak learning rate, no sweep (default: --lr)")
    sweep = " ".join(f"{rate:g}" for rate in defaults.lr_sweep)
    train.add_argument(
        "--lr-sweep",
        type=float,
        nargs="+",
        metavar="LR",
        help=f"the starting grid swept at the smallest size, per architecture (default {sweep}; extended x2 until "
        "the best rate is bracketed)",
    )
    train.add_argument(
        "--plain-twin",
        action="store_true",
        help="add transformers' twin as it ships (embeddings unscaled) as a second row next to the control",
    )
    train.add_argument(
        "--scaled-twin",
        action="store_true",
        help="(the default now: the baseline is the control; kept for old commands)",
    )
    train.add_argument("--corpus", choices=("stdlib", "python"), help="stdlib, or the stdlib and site-packages")
    train.add_argument("--max-chars", type=int, help="characters of corpus to read")
    train.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: CUDA when there is one)")
    train.add_argument(
        "--threads", type=int, help="torch CPU threads (default 1: fastest for tiny models on a shared CPU)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_ladder_command)


__all__ = ["add_parsers", "run_ladder_command"]
