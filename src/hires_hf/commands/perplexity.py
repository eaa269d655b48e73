"""`hires-hf perplexity`: sliding-window perplexity of a model on a text file; the work is in `hires_hf.eval`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import HiResUserError
from . import add_model_options


def run_perplexity(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..eval.harness import check_model
    from ..eval.perplexity import sliding_window_perplexity
    from ..io import write_json_atomic

    for name in ("window", "stride", "batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise HiResUserError(f"--{name.replace('_', '-')} must be at least 1.")
    if args.window and args.stride and args.stride > args.window:
        raise HiResUserError(f"--stride {args.stride} exceeds --window {args.window}; every token must be scored.")
    text_path = Path(args.file)
    if not text_path.is_file():
        raise HiResUserError(f"text file {args.file!r} does not exist.")
    try:
        text = text_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise HiResUserError(f"{args.file} is not UTF-8 text ({error.reason}).") from error
    check_model(args.model, args.trust_remote_code)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, trust_remote_code=args.trust_remote_code)
    model.to(device).eval()
    if args.window and args.window > model.config.max_position_embeddings:
        raise HiResUserError(
            f"--window {args.window} exceeds the model's context ({model.config.max_position_embeddings} tokens)."
        )
    result = sliding_window_perplexity(model, tokenizer, text, args.window, args.stride, batch_size=args.batch_size)
    print(
        f"{args.file}: {result.tokens} tokens, window {result.window}, stride {result.stride}: "
        f"perplexity {result.perplexity:.4f}, bits/byte {result.bits_per_byte:.4f}, "
        f"word perplexity {result.word_perplexity:.4f}"
    )
    if args.out:
        write_json_atomic(Path(args.out), {"model": args.model, "file": args.file, **result.as_dict()}, indent=None)
    return 0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("perplexity", help="sliding-window perplexity of a model on a text file")
    parser.add_argument("model", metavar="MODEL", help="model folder or Hub id")
    parser.add_argument("file", metavar="FILE", help="UTF-8 text file")
    parser.add_argument("--window", type=int, default=None, help="tokens per forward pass (default: model context)")
    parser.add_argument(
        "--stride", type=int, default=None, help="new tokens scored per window (default: window, as lm-eval)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=4, help="windows scored at once (default 4: the command's own; speed only)"
    )
    parser.add_argument("--out", metavar="FILE", help="also write the numbers as JSON")
    add_model_options(parser)
    parser.set_defaults(func=run_perplexity)
