"""`hires-hf info`: what a preset or config costs, HiRes next to its vanilla twin."""

from __future__ import annotations

import argparse

from .accounting import cost, hires_flops_overhead
from .configuration_hires import PRESETS, HiResConfig
from .loading import load_config
from .tables import markdown_table


def cost_table(config: HiResConfig, seq_len: int) -> str:
    """A markdown table: params and counted FLOPs/token for HiRes and its vanilla twin."""
    hires, vanilla = cost(config, seq_len), cost(config, seq_len, vanilla=True)
    rows = [
        (name, f"{c.params:,}", f"{c.forward_flops_per_token:,.0f}", f"{c.train_flops_per_token:,.0f}")
        for name, c in [
            ("vanilla twin", vanilla),
            (f"HiRes (D={config.residual_size}, k={config.layers_per_block})", hires),
        ]
    ]
    table = markdown_table(["model", "params", "fwd FLOPs/token", "train FLOPs/token"], rows, align="lrrr")
    overhead = hires_flops_overhead(config, seq_len)
    return "\n".join(table) + f"\n\nHiRes FLOPs overhead at {seq_len} tokens of context: {overhead:+.2%}"


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
