"""`hires-hf info`: what a preset or config costs, HiRes next to its vanilla twin."""

from __future__ import annotations

import argparse

from ..accounting import cost_table
from ..configuration_hires import PRESETS
from ..loading import load_config


def run_info(args: argparse.Namespace) -> int:
    config = load_config(args.model)
    print(
        f"d={config.hidden_size} D={config.residual_size} L={config.num_hidden_layers} "
        f"k={config.layers_per_block} blocks={config.num_blocks} experts={config.num_experts}"
    )
    seq_len = args.seq_len or config.max_position_embeddings
    origin = "--seq-len" if args.seq_len else "the model's max_position_embeddings; --seq-len to change it"
    print(f"attention FLOPs counted at a context of {seq_len} tokens ({origin})")
    print(cost_table(config, seq_len))
    return 0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("info", help="parameters and counted FLOPs of a preset or config, vs vanilla")
    parser.add_argument("model", help=f"preset ({', '.join(sorted(PRESETS))}), config.json or model folder")
    parser.add_argument(
        "--seq-len", type=int, help="context the attention FLOPs are counted at (default: the model's context)"
    )
    parser.set_defaults(func=run_info)
