"""`hires-hf` command line: the top level that gathers the sub-commands and turns user errors into one line.

Each command module (`hires_hf/commands/`, one a command) exposes `add_parsers(subparsers)`, which adds its
sub-command and sets `func` on it; a `HiResUserError` (or `ValueError` from a config) becomes one line on stderr
and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from huggingface_hub.errors import StrictDataclassError

from .errors import HiResUserError

# Modules whose `add_parsers` contribute sub-commands. The package's own always import: if one fails, that is a
# bug to see, not a command to drop quietly.
COMMAND_MODULES = (
    "hires_hf.commands.info",
    "hires_hf.commands.convert",
    "hires_hf.commands.train",
    "hires_hf.commands.demo",
    "hires_hf.commands.ladder",
    "hires_hf.commands.compare",
    "hires_hf.commands.eval",
    "hires_hf.commands.perplexity",
    "hires_hf.commands.scaling",
    "hires_hf.commands.inspect",
    "hires_hf.commands.publish",
)


def build_parser() -> argparse.ArgumentParser:
    """Every `hires-hf` command; the same wherever it runs (benchmarks are the checkout's `python -m benchmarks`)."""
    parser = argparse.ArgumentParser(prog="hires-hf", description="HiRes (Hierarchical Residuals) for transformers")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parsers(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hires-hf` console script."""
    args = build_parser().parse_args(argv)
    try:
        result = args.func(args)
    except (HiResUserError, FileNotFoundError, NotADirectoryError, PermissionError) as error:
        print(f"hires-hf {args.command}: error: {error}", file=sys.stderr)
        return 2
    except (ValueError, StrictDataclassError) as error:  # configs raise ValueError, wrapped by strict validation
        if os.environ.get("HIRES_HF_DEBUG"):
            raise
        cause = error.__cause__ or error
        print(f"hires-hf {args.command}: error: {cause}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
