"""`hires-hf inspect`: look inside a model folder or a training run; the work is in `hires_hf.diagnostics`."""

from __future__ import annotations

import argparse
from functools import partial

from ..diagnostics.inspection import inspect
from ..training.prepare import probe_ids
from . import default


def run_inspect(args: argparse.Namespace) -> int:
    ids = partial(probe_ids, text_path=args.text, seq_len=args.seq_len, batch=args.batch)
    return inspect(args.target, out=args.out, probe_ids=ids)


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="look inside a model folder or a training run (wide stream per block, spectra, update ratios)",
        description="A model folder: one probe per block on held-out text (table; inspect.png and inspect.json in "
        "MODEL_DIR-inspect/ next to it, or --out). A run folder or diagnostics.jsonl: the diagnostics over training "
        "steps (table, diagnostics.png next to the diagnostics).",
    )
    parser.add_argument("target", help="a saved model folder, a run output folder, or a diagnostics.jsonl")
    parser.add_argument("--text", help="probe text file (default: held-out Python stdlib sources)")
    parser.add_argument("--seq-len", type=int, default=default(probe_ids, "seq_len"))
    parser.add_argument("--batch", type=int, default=default(probe_ids, "batch"))
    parser.add_argument("--out", help="folder for the figure (default: next to the target, never inside a model)")
    parser.set_defaults(func=run_inspect)
