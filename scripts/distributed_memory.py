"""Parameters and training memory per rank of HiRes under transformers' distributed modes (docs/distributed.md).

    python scripts/distributed_memory.py

Counts come from `hires_hf.accounting` and the plans of `HiResConfig` (what each mode shards, what it replicates).
Training state is 16 bytes a parameter (fp32 weights and gradients, AdamW's two moments); activations are left out.
FSDP2 also holds one all-gathered unit at a time (a decoder layer, or a block's own read / write / norms) on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from hires_hf import HiResConfig
from hires_hf.accounting import count_parameters, hires_extra_params, layer_macs_per_token, layer_params
from hires_hf.tables import markdown_row, markdown_table

BYTES_PER_PARAM = 16  # fp32 weight + gradient + AdamW's m and v
SEQ_LEN = 4096

# ~1B dense: OLMo-1B's layer shape (d 2048, 16 layers, SwiGLU 8192, vocab 50304), made HiRes with D = 2d, k = 4.
DENSE_1B = dict(
    vocab_size=50304,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=16,
    residual_size=4096,
    layers_per_block=4,
)


@dataclass(frozen=True)
class Layout:
    name: str
    tp: int = 1
    fsdp: int = 1
    ep: int = 1


def replicated_under_tp(config: HiResConfig) -> int:
    """What every tensor-parallel rank holds whole: read / write / read-out projections, every norm, the routers."""
    d = config.hidden_size
    norms = 2 * d + {
        "full": config.num_attention_heads * config.head_dim + config.num_key_value_heads * config.head_dim
    }.get(config.qk_norm, 2 * config.head_dim if config.qk_norm == "per_head" else 0)
    router = config.num_experts * d
    return hires_extra_params(config) + config.num_hidden_layers * (norms + router) + d


def params_per_rank(config: HiResConfig, layout: Layout) -> float:
    """Parameters resident on one rank: TP splits the layers, the embedding and the head; FSDP2 (and EP, which
    splits experts over ep ranks and FSDP-shards them over the other fsdp x tp / ep) split what is left."""
    total = count_parameters(config)
    replicated = replicated_under_tp(config)
    sharded = total - replicated
    return (sharded / layout.tp + replicated) / layout.fsdp


def replicated_compute_share(config: HiResConfig, tp: int) -> float:
    """Share of one tensor-parallel rank's forward matmuls spent on the projections every rank repeats (the layers
    and the head are split tp ways; read / write / read-out are not)."""
    d, wide = config.hidden_size, config.residual_size
    projections = config.num_blocks * 2 * d * wide + wide * d
    split = config.num_hidden_layers * layer_macs_per_token(config, SEQ_LEN) + config.vocab_size * d
    return projections / (split / tp + projections)


def largest_fsdp_unit(config: HiResConfig) -> int:
    """The most parameters FSDP2 gathers at once: a decoder layer, the embedding, or the head."""
    return max(layer_params(config), config.vocab_size * config.residual_size, config.vocab_size * config.hidden_size)


def table(name: str, config: HiResConfig, layouts: list[Layout]) -> str:
    total = count_parameters(config)
    lines = [
        f"**{name}**: {total / 1e9:.2f}B parameters ({replicated_under_tp(config) / 1e6:.0f}M replicated under TP: "
        f"read / write / read-out, norms, routers); largest FSDP2 unit {largest_fsdp_unit(config) / 1e6:.0f}M.",
        "",
        *markdown_table(
            [
                "layout (GPUs)",
                "parameters per rank",
                "training state per rank (16 B/param)",
                f"replicated projections' share of a rank's matmuls (T = {SEQ_LEN})",
            ]
        ),
    ]
    for layout in layouts:
        per_rank = params_per_rank(config, layout)
        share = f"{replicated_compute_share(config, layout.tp):.0%}" if layout.tp > 1 else "-"
        gib = per_rank * BYTES_PER_PARAM / 2**30
        lines.append(markdown_row([layout.name, f"{per_rank / 1e6:,.0f}M", f"{gib:.1f} GiB", share]))
    return "\n".join(lines)


def main() -> None:
    dense = HiResConfig(**DENSE_1B)
    moe = HiResConfig.from_preset("olmoe-1b-7b")
    print(
        table(
            "~1B dense HiRes (OLMo-1B layers, D = 4096, k = 4)",
            dense,
            [
                Layout("one GPU"),
                Layout("FSDP2 x 8", fsdp=8),
                Layout("TP x 2", tp=2),
                Layout("TP x 8", tp=8),
                Layout("TP x 2, FSDP2 x 4", tp=2, fsdp=4),
            ],
        )
    )
    print()
    print(
        table(
            "OLMoE-1B-7B HiRes (`olmoe-1b-7b`: 64 experts, top 8, D = 4096, k = 4)",
            moe,
            [
                Layout("one GPU"),
                Layout("FSDP2 x 8", fsdp=8),
                Layout("FSDP2 x 8, EP x 8", fsdp=8, ep=8),
                Layout("TP x 2", tp=2),
                Layout("TP x 8", tp=8),
                Layout("FSDP2 x 64, EP x 8 (8 nodes)", fsdp=64, ep=8),
            ],
        )
    )


if __name__ == "__main__":
    main()
