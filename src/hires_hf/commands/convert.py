"""`hires-hf convert`: argument parsing and the report; the work is in `hires_hf.conversion.convert`."""

from __future__ import annotations

import argparse

from ..conversion.convert import DTYPES, ConversionReport, convert
from ..conversion.keymaps import KEY_MAPS
from . import default


def run_convert(args: argparse.Namespace) -> int:
    report = convert(
        args.src,
        args.dst,
        residual_size=args.residual_size,
        layers_per_block=args.layers_per_block,
        exact=args.exact,
        dtype=args.dtype,
        force=args.force,
        max_shard_size=args.max_shard_size,
        max_position_embeddings=args.max_position_embeddings,
        check=not args.skip_check,
        tolerance=args.tolerance,
    )
    print(summary(report))
    return 0


def summary(report: ConversionReport) -> str:
    """A few lines: what was written, how, and what the check measured."""
    config = report.config
    lines = [
        f"wrote {report.destination}: {report.num_tensors} tensors in {report.num_shards} shard(s), "
        f"d={config.hidden_size} D={config.residual_size} L={config.num_hidden_layers} k={config.layers_per_block}",
        *report.notes,
    ]
    if report.max_abs_logit_diff is not None:
        check = f"check: max |Δ logits| = {report.max_abs_logit_diff:.3g}"
        if report.tolerance is not None:
            check += f" (tolerance {report.tolerance:.3g}): OK"
        lines.append(check)
        lines.append(
            f"check: loss on {report.loss_sample}: {report.source_loss:.4f} (source) -> {report.hires_loss:.4f} "
            f"(HiRes), shift {report.hires_loss - report.source_loss:+.4f}"
        )
    return "\n".join(lines)


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help=f"convert a vanilla checkpoint ({', '.join(KEY_MAPS)}) into a HiRes model folder",
        description="Convert a vanilla checkpoint into HiRes, streamed shard by shard, then check it on random ids.",
    )
    parser.add_argument("src", help="source model folder (or Hub id when online)")
    parser.add_argument("dst", help="destination folder for the HiRes model")
    parser.add_argument("--residual-size", type=int, required=True, help="D, the residual width between blocks")
    parser.add_argument("--layers-per-block", type=int, required=True, help="k, layers per block (divides L)")
    parser.add_argument(
        "--exact",
        action="store_true",
        help="function-preserving HiRes (write_mode=delta, no outer norm): logits equal the source's",
    )
    parser.add_argument(
        "--dtype", default=default(convert, "dtype"), choices=["auto", *DTYPES], help="dtype of the written weights"
    )
    parser.add_argument("--force", action="store_true", help="replace DST if it exists")
    parser.add_argument(
        "--max-shard-size", default=default(convert, "max_shard_size"), help="largest output shard (e.g. 2GB, 500MB)"
    )
    parser.add_argument(
        "--max-position-embeddings", type=int, default=None, help="cap the context (e.g. to a sliding window)"
    )
    parser.add_argument("--tolerance", type=float, default=None, help="max |Δ logits| allowed with --exact")
    parser.add_argument(
        "--skip-check", action="store_true", help="skip the closing logits check (it loads both models in float32)"
    )
    parser.set_defaults(func=run_convert)
