"""`hires-hf publish`: upload a HiRes checkpoint to the Hub with a model card; the work is in `hires_hf.publish`."""

from __future__ import annotations

import argparse

from ..publish import publish
from . import default


def run_publish(args: argparse.Namespace) -> int:
    where = publish(
        args.model,
        args.repo_id,
        private=args.private,
        revision=args.revision,
        commit_message=args.commit_message,
        dry_run=args.dry_run,
        results=args.results,
        tokenizer=args.tokenizer,
        license=args.license,
        base_model=args.base_model,
        datasets=args.dataset,
        max_shard_size=args.max_shard_size,
    )
    print(f"wrote the Hub folder to {where}" if args.dry_run else f"published {args.repo_id}: {where}")
    return 0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "publish", help="upload a HiRes checkpoint to the Hub with a model card and remote code"
    )
    parser.add_argument("model", help="a saved HiRes model folder (config.json + weights + tokenizer)")
    parser.add_argument("--repo-id", required=True, help="ORG/NAME of the Hub repo (created if needed)")
    parser.add_argument("--private", action="store_true", help="create the repo private (an existing repo keeps its)")
    parser.add_argument("--revision", help="branch to commit to (created if needed; default main)")
    parser.add_argument("--commit-message", help="message of the single upload commit")
    parser.add_argument(
        "--dry-run", metavar="OUT", help="write the folder the Hub would receive to OUT; upload nothing"
    )
    parser.add_argument(
        "--results",
        metavar="FILE",
        help="lm-eval results JSON (or its output folder), or hires-hf eval --out's file, for model-index",
    )
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder, if not inside MODEL")
    parser.add_argument("--license", help="licence id for the card (e.g. apache-2.0); default 'other'")
    parser.add_argument("--base-model", help="Hub id of the checkpoint this was converted from (else from config)")
    parser.add_argument("--dataset", action="append", help="Hub id of a training dataset (repeatable; else config)")
    parser.add_argument(
        "--max-shard-size", default=default(publish, "max_shard_size"), help="largest safetensors shard (e.g. 2GB)"
    )
    parser.set_defaults(func=run_publish)
