"""`hires-hf demo`: a tiny HiRes, the control and the plain twin at equal counted FLOPs; the work is in the demo."""

from __future__ import annotations

import argparse

from ..configuration_hires import PRESETS
from ..errors import HiResUserError
from ..experiments.demo import DemoSettings, run_demo
from . import default, set_threads


def run_demo_command(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    for flag in ("budget_minutes", "budget_flops"):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:
            raise HiResUserError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}.")
    if args.preset not in PRESETS:
        raise HiResUserError(f"Unknown preset {args.preset!r}; available: {', '.join(sorted(PRESETS))}.")
    options = {"preset": args.preset, "budget_minutes": args.budget_minutes, "seed": args.seed}
    if args.budget_flops is not None:
        options["budget_flops"] = args.budget_flops
    settings = DemoSettings.smoke(**options) if args.smoke else DemoSettings(**options)
    run_demo(args.output_dir, settings)
    return 0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo", help="train a tiny HiRes, the control (the baseline) and the plain twin at equal counted FLOPs"
    )
    demo.add_argument(
        "--budget-flops",
        type=float,
        help=f"counted training FLOPs per model (default {default(DemoSettings, 'budget_flops'):.2g}, the README's)",
    )
    demo.add_argument(
        "--budget-minutes", type=float, help="instead: what this machine's measured speed buys in these minutes"
    )
    demo.add_argument("--smoke", action="store_true", help="a seconds-long run (tiny data and steps) for tests")
    demo.add_argument(
        "--preset", default=default(DemoSettings, "preset"), help=f"HiRes preset ({', '.join(sorted(PRESETS))})"
    )
    demo.add_argument("--seed", type=int, default=default(DemoSettings, "seed"))
    demo.add_argument("--threads", type=int, help="torch CPU threads (default: every core)")
    demo.add_argument(
        "--output-dir", default="runs/demo", help="table.md, loss_vs_flops.png, control/, hires/, plain-twin/"
    )
    demo.set_defaults(func=run_demo_command)
