"""The `hires-hf` sub-commands, one module each (as transformers keeps `transformers/cli/`).

A command module holds argument parsing, the checks that name a flag, and the lines it prints; the work is a call
into the library. Each exposes `add_parsers(subparsers)`, which adds its sub-command and sets `func` on it;
`hires_hf.cli` gathers them and turns a `HiResUserError` into one line and exit code 2. Defaults the library
already has (a settings dataclass's field, a function's keyword) are read from it with `default`, never retyped;
a command's own default says so in its help (train's `--batch-size`, perplexity's `--batch-size`).
"""

from __future__ import annotations

import argparse
import dataclasses
from inspect import Parameter, signature  # `import inspect` would be shadowed by the inspect command
from typing import Any


def default(owner: Any, name: str) -> Any:
    """The default `owner` (a dataclass, or a function's keyword argument) gives `name`."""
    if dataclasses.is_dataclass(owner):
        field = next(field for field in dataclasses.fields(owner) if field.name == name)
        if field.default is dataclasses.MISSING:
            raise TypeError(f"{owner.__name__}.{name} has no plain default")
        return field.default
    value = signature(owner).parameters[name].default
    if value is Parameter.empty:
        raise TypeError(f"{owner.__name__}() has no default for {name}")
    return value


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype, --trust-remote-code: how a command that loads a model folder loads it."""
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"), help="weights dtype"
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run a folder's own modeling code (not needed for HiRes: hires_hf registers it)",
    )


def set_threads(threads: int | None) -> None:
    """`--threads`: tiny models run fastest on one thread when the CPU is shared (threads spin-wait on each other)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


__all__ = ["add_model_options", "default", "set_threads"]
