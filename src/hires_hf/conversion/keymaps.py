"""Conversion as data: where each HiRes tensor comes from in a vanilla checkpoint, per source family.

A `Rule` names one HiRes key (placeholders `{layer}`, `{block}`), the source keys it is built from (placeholders
`{layer}`, `{expert}`) and the named transform that builds it. HiRes layers carry the vanilla names
(`model.layers.{layer}.*`, the same index): only the blocks' own tensors and the wide embedding are new. Several
rules may target one key: the first whose sources all exist in the checkpoint wins (e.g. OLMoE experts saved one
by one, or already fused in 3D).

Rules whose target the HiRes config does not have (a bias the config turns off, q/k norms of a family without
them) are skipped, so one family map serves every variant of the family; a source tensor no rule reads is an
error in the converter, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

SRC_LAYER = "model.layers.{layer}."
HIRES_LAYER = SRC_LAYER  # the layers keep their place and name
HIRES_BLOCK = "model.blocks.{block}."  # a block's own read / write / norms


@dataclass(frozen=True)
class Rule:
    """One HiRes tensor: `transform(sources) -> target`; no sources means the converter generates it."""

    target: str
    sources: tuple[str, ...] = ()
    transform: str = "copy"
    only_if_source_tied: bool = False  # read a tied source's embedding as its head, never an untied one's


def _layer_rules(suffixes: tuple[str, ...]) -> tuple[Rule, ...]:
    """Tensors copied under their own name (`model.layers.{layer}.S`)."""
    return tuple(Rule(HIRES_LAYER + suffix, (SRC_LAYER + suffix,)) for suffix in suffixes)


def _with_bias(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{name}.{kind}" for name in names for kind in ("weight", "bias"))


NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
ATTENTION = _with_bias(tuple(f"self_attn.{p}_proj" for p in "qkvo"))  # biases only where the config has them
QK_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
DENSE_MLP = _with_bias(("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))

# What every HiRes model has around its layers, whatever the source family.
OUTER = (
    Rule("model.embed_tokens.weight", ("model.embed_tokens.weight",), "pad_columns"),  # V x d -> V x D
    Rule("model.norm.weight", ("model.norm.weight",)),
    Rule("lm_head.weight", ("lm_head.weight",)),
    Rule("lm_head.weight", ("model.embed_tokens.weight",), only_if_source_tied=True),  # tied source, D > d
    Rule(HIRES_BLOCK + "read_proj.weight", (), "identity"),  # [I_d | 0]
    Rule(HIRES_BLOCK + "write_proj.weight", (), "identity"),  # [I_d ; 0]
    Rule(HIRES_BLOCK + "write_norm.weight", (), "ones"),
    Rule(HIRES_BLOCK + "outer_norm.weight", (), "ones"),
    Rule("model.read_out.weight", (), "identity"),
)

# OLMoE experts: per-expert 2D tensors (what `OlmoeForCausalLM.save_pretrained` writes in transformers 5, and
# every released OLMoE checkpoint) or the 3D tensors transformers 5 holds in memory.
OLMOE_EXPERTS = (
    Rule(
        HIRES_LAYER + "mlp.experts.gate_up_proj",
        (SRC_LAYER + "mlp.experts.{expert}.gate_proj.weight", SRC_LAYER + "mlp.experts.{expert}.up_proj.weight"),
        "stack_experts",  # E x (I, d) and E x (I, d) -> (E, 2I, d), gate rows first
    ),
    Rule(HIRES_LAYER + "mlp.experts.gate_up_proj", (SRC_LAYER + "mlp.experts.gate_up_proj",)),
    Rule(
        HIRES_LAYER + "mlp.experts.down_proj",
        (SRC_LAYER + "mlp.experts.{expert}.down_proj.weight",),
        "stack_experts",  # E x (d, I) -> (E, d, I)
    ),
    Rule(HIRES_LAYER + "mlp.experts.down_proj", (SRC_LAYER + "mlp.experts.down_proj",)),
    Rule(HIRES_LAYER + "mlp.gate.weight", (SRC_LAYER + "mlp.gate.weight",)),
)

DENSE_FAMILY = OUTER + _layer_rules(NORMS + ATTENTION + QK_NORMS + DENSE_MLP)
MOE_FAMILY = OUTER + _layer_rules(NORMS + ATTENTION + QK_NORMS) + OLMOE_EXPERTS

# model_type (config.json) -> rules. Llama, Mistral, Qwen2 and Qwen3 share tensor names; their differences
# (biases, q/k norm, sliding windows) are config differences, handled in convert.hires_fields.
KEY_MAPS: dict[str, tuple[Rule, ...]] = {
    "llama": DENSE_FAMILY,
    "mistral": DENSE_FAMILY,
    "qwen2": DENSE_FAMILY,
    "qwen3": DENSE_FAMILY,
    "olmoe": MOE_FAMILY,
}

# Source tensors that carry no weights (old checkpoints saved RoPE's frequency buffer).
IGNORED_SOURCE_SUFFIXES = ("rotary_emb.inv_freq",)


__all__ = ["IGNORED_SOURCE_SUFFIXES", "KEY_MAPS", "Rule"]
