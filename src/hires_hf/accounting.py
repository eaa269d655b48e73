"""Parameters and counted FLOPs of a HiRes config and of its vanilla twin.

Compute claims ("same loss at 77% of the compute") must be made on counted FLOPs, not parameter counts:
the HiRes read/write projections add FLOPs that parameters alone understate, and its D-wide embedding adds
parameters that cost no FLOPs. Everything here is a pure function of the config.

Conventions: a multiply-accumulate is 2 FLOPs; matmuls only (norms, softmax, activations and RoPE are
O(width) per token and left out, as in the usual 6N accounting); attention scores count the causal average
context `(T + 1) / 2` unless `causal=False` (what a dense T x T kernel actually multiplies).
"""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedConfig

from .configuration_hires import HiResConfig
from .errors import HiResUserError
from .tables import markdown_table
from .twins import hires_layer_fields


@dataclass(frozen=True)
class Cost:
    """Parameters and FLOPs of one architecture at one context length."""

    params: int
    forward_flops_per_token: float

    @property
    def train_flops_per_token(self) -> float:
        """Forward + backward ~= 3 x forward."""
        return 3.0 * self.forward_flops_per_token


def layer_params(config: HiResConfig) -> int:
    """Parameters of one d-wide decoder layer (attention, FFN, two norms)."""
    d, h = config.hidden_size, config.head_dim
    q_width, kv_width = config.num_attention_heads * h, config.num_key_value_heads * h
    attn = d * q_width + 2 * d * kv_width + q_width * d
    if config.attention_bias:
        attn += q_width + 2 * kv_width
    if config.attention_output_bias:
        attn += d
    if config.qk_norm == "full":
        attn += q_width + kv_width
    elif config.qk_norm == "per_head":
        attn += 2 * h
    if config.is_moe:
        ffn = config.num_experts * d + config.num_experts * 3 * d * config.moe_intermediate_size
    else:
        ffn = 3 * d * config.intermediate_size + (2 * config.intermediate_size + d if config.mlp_bias else 0)
    return attn + ffn + 2 * d


def hires_extra_params(config: HiResConfig) -> int:
    """What HiRes adds on top of the layers: read/write per block, write and outer norms, read-out."""
    d, wide = config.hidden_size, config.residual_size
    per_block = 2 * d * wide + (wide if config.outer_norm else 0) + (d if config.write_norm else 0)
    return config.num_blocks * per_block + wide * d


def count_parameters(config: HiResConfig, vanilla: bool = False) -> int:
    """Total parameters of `HiResForCausalLM(config)`, or of its vanilla twin (embedding V x d, no blocks)."""
    embed_width = config.hidden_size if vanilla else config.residual_size
    embed = config.vocab_size * embed_width
    head = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    extra = 0 if vanilla else hires_extra_params(config)
    return embed + config.num_hidden_layers * layer_params(config) + extra + config.hidden_size + head


def layer_macs_per_token(config: HiResConfig, seq_len: int, causal: bool = True) -> float:
    """Multiply-accumulates of one layer for one token (the expert FFN counts only the K experts it uses)."""
    d, h = config.hidden_size, config.head_dim
    q_width, kv_width = config.num_attention_heads * h, config.num_key_value_heads * h
    projections = d * q_width + 2 * d * kv_width + q_width * d
    context = (seq_len + 1) / 2 if causal else seq_len
    scores = 2 * context * q_width  # QK^T and PV
    if config.is_moe:
        ffn = d * config.num_experts + config.num_experts_per_tok * 3 * d * config.moe_intermediate_size
    else:
        ffn = 3 * d * config.intermediate_size
    return projections + scores + ffn


def forward_flops_per_token(
    config: HiResConfig, seq_len: int, causal: bool = True, vanilla: bool = False, include_head: bool = True
) -> float:
    """Counted forward FLOPs per token: layers + (HiRes read/write/read-out) + LM head."""
    d = config.hidden_size
    macs = config.num_hidden_layers * layer_macs_per_token(config, seq_len, causal)
    if not vanilla:
        macs += config.num_blocks * 2 * d * config.residual_size + config.residual_size * d
    if include_head:
        macs += config.vocab_size * d
    return 2.0 * macs


def cost(config: HiResConfig, seq_len: int, vanilla: bool = False) -> Cost:
    """Parameters and causal forward FLOPs per token, for HiRes or (vanilla=True) its vanilla twin."""
    return Cost(count_parameters(config, vanilla), forward_flops_per_token(config, seq_len, vanilla=vanilla))


def hires_flops_overhead(config: HiResConfig, seq_len: int) -> float:
    """Relative extra forward FLOPs of HiRes over its vanilla twin (0.08 = 8%)."""
    hires = forward_flops_per_token(config, seq_len)
    return hires / forward_flops_per_token(config, seq_len, vanilla=True) - 1.0


def train_flops_per_token(config: PreTrainedConfig, seq_len: int) -> float:
    """Counted training FLOPs per token (3 x forward) of a HiRes config or of any Llama / Qwen3 / OLMoE config."""
    if isinstance(config, HiResConfig):
        return 3.0 * forward_flops_per_token(config, seq_len)
    return 3.0 * forward_flops_per_token(_as_hires_shape(config), seq_len, vanilla=True)


def _as_hires_shape(config: PreTrainedConfig) -> HiResConfig:
    """The HiRes config whose vanilla layers are those of a Llama / Qwen3 / OLMoE config (for FLOP counting)."""
    try:
        layers = hires_layer_fields(config)
        return HiResConfig(**layers, residual_size=layers["hidden_size"], layers_per_block=layers["num_hidden_layers"])
    except (AttributeError, ValueError, StrictDataclassError) as error:
        raise HiResUserError(
            f"Cannot count FLOPs of a {type(config).__name__}; pass flops_per_token explicitly ({error})."
        ) from error


def cost_table(config: HiResConfig, seq_len: int) -> str:
    """A markdown table: params and counted FLOPs/token for HiRes and its vanilla twin, and the FLOPs overhead."""
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


__all__ = [
    "Cost",
    "cost",
    "cost_table",
    "count_parameters",
    "forward_flops_per_token",
    "hires_extra_params",
    "hires_flops_overhead",
    "layer_macs_per_token",
    "layer_params",
    "train_flops_per_token",
]
