"""`hires-hf scaling`: fit L(C) per architecture and the FLOPs-efficiency multiplier; the work is in `hires_hf.eval`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import HiResUserError
from ..eval.scaling import analyse, plot_fits, read_runs, report_table
from ..io import write_json_atomic
from . import default


def run_scaling(args: argparse.Namespace) -> int:
    if args.bootstrap < 0:
        raise HiResUserError("--bootstrap must be 0 (no interval) or a positive number of resamples.")
    if args.noise < 0:
        raise HiResUserError("--noise must be 0 (resample the fit's residuals) or a positive number of nats.")
    runs = read_runs(args.runs)
    report = analyse(
        runs,
        baseline=args.baseline,
        irreducible=args.irreducible,
        at_compute=args.at_compute,
        at_loss=args.at_loss,
        bootstrap=args.bootstrap,
        seed=args.seed,
        noise=args.noise,
    )
    out_dir = Path(args.out_dir or Path(args.runs).parent)
    write_json_atomic(out_dir / "scaling_fit.json", report.as_dict())
    plot = plot_fits(report, out_dir / "scaling_fit.png")
    print(report_table(report))
    if not report.multipliers:
        print(f"\nno {args.baseline!r} runs: fits only (set the baseline architecture with --baseline).")
    print(f"\nwrote {out_dir / 'scaling_fit.json'} and {plot}")
    return 0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("scaling", help="fit L(C) per architecture; FLOPs-efficiency multiplier + PNG")
    parser.add_argument("runs", metavar="RUNS", help="JSON/JSONL of {arch, params, flops, loss} records")
    parser.add_argument("--out-dir", default=None, help="where scaling_fit.json / .png go (default: next to RUNS)")
    parser.add_argument(
        "--baseline", default=default(analyse, "baseline"), help="architecture the multipliers are relative to"
    )
    parser.add_argument("--irreducible", action="store_true", help="fit L = A*C^-alpha + E (needs >= 3 sizes)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--at-compute", type=float, help="multiplier at this compute (default: largest run)")
    where.add_argument("--at-loss", type=float, help="multiplier at this loss")
    parser.add_argument(
        "--bootstrap", type=int, default=default(analyse, "bootstrap"), help="resamples for the confidence interval"
    )
    parser.add_argument("--seed", type=int, default=default(analyse, "seed"))
    parser.add_argument(
        "--noise",
        type=float,
        default=default(analyse, "noise"),
        help="one point's loss noise in nats (the seed standard deviation): the least the bootstrap assumes",
    )
    parser.set_defaults(func=run_scaling)
