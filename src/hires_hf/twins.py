"""Vanilla twins: the transformers model with the same d-wide layers as a HiRes config, and back.

A twin is what HiRes is compared against (same compute width, depth, heads and FFN; residual stream of
width d, no blocks). Dense layers without q/k norm are Llama (Qwen2 with q/k/v-only bias), per-head q/k
norm is Qwen3, MoE with full-width q/k norm is OLMoE. This module holds the one mapping between the two
families of configs: `vanilla_config` (HiRes -> twin) and `hires_layer_fields` (a vanilla config -> the HiRes
fields with the same layers), used by the converter and by the FLOP accounting of vanilla models.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import LlamaConfig, OlmoeConfig, PreTrainedConfig, Qwen2Config, Qwen3Config

from .configuration_hires import HiResConfig

# Fields with the same name and meaning in HiResConfig and in the Llama / Mistral / Qwen / OLMoE configs.
SHARED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "tie_word_embeddings",
    "rope_parameters",
    "attention_dropout",
)


def vanilla_config(config: HiResConfig) -> PreTrainedConfig:
    """The Llama / Qwen3 / OLMoE config whose layers are exactly the HiRes layers."""
    shared: dict[str, Any] = {name: getattr(config, name) for name in SHARED_FIELDS}
    shared["tie_word_embeddings"] = config.tie_word_embeddings and config.residual_size == config.hidden_size
    biased = config.attention_bias
    if config.is_moe:
        _require_twin(config.qk_norm == "full" and not config.mlp_bias, config, "OLMoE (full-width q/k norm)")
        _require_twin(biased == config.attention_output_bias, config, "OLMoE (one attention_bias for q/k/v/o)")
        return OlmoeConfig(
            **shared,
            intermediate_size=config.moe_intermediate_size,
            num_experts=config.num_experts,
            num_experts_per_tok=config.num_experts_per_tok,
            norm_topk_prob=config.norm_topk_prob,
            router_aux_loss_coef=config.router_aux_loss_coef,
            output_router_logits=config.output_router_logits,
            attention_bias=biased,
            clip_qkv=config.clip_qkv,
        )
    _require_twin(config.clip_qkv is None, config, "Llama / Qwen3 (no clip_qkv)")
    if config.qk_norm is None and biased and not config.attention_output_bias:
        _require_twin(not config.mlp_bias, config, "Qwen2 (q/k/v bias, no o bias)")
        return Qwen2Config(**shared, intermediate_size=config.intermediate_size)
    if config.qk_norm is None:
        _require_twin(biased == config.attention_output_bias, config, "Llama (one attention_bias for q/k/v/o)")
        return LlamaConfig(
            **shared, intermediate_size=config.intermediate_size, attention_bias=biased, mlp_bias=config.mlp_bias
        )
    _require_twin(config.qk_norm == "per_head" and not config.mlp_bias, config, "Qwen3 (per-head q/k norm)")
    _require_twin(biased == config.attention_output_bias, config, "Qwen3 (one attention_bias for q/k/v/o)")
    return Qwen3Config(**shared, intermediate_size=config.intermediate_size, attention_bias=biased)


def hires_layer_fields(source: PreTrainedConfig) -> dict[str, Any]:
    """The HiResConfig fields whose layers are exactly those of a Llama / Mistral / Qwen2 / Qwen3 / OLMoE config
    (the inverse of `vanilla_config`); the HiRes-only fields (D, k, ...) are left to the caller.

    A missing required field (the config is of another family) raises AttributeError."""
    fields: dict[str, Any] = {name: getattr(source, name) for name in SHARED_FIELDS if name != "head_dim"}
    biased = bool(getattr(source, "attention_bias", False))
    fields |= dict(
        head_dim=getattr(source, "head_dim", None),
        intermediate_size=source.intermediate_size,
        attention_bias=biased,
        attention_output_bias=biased,
        mlp_bias=bool(getattr(source, "mlp_bias", False)),
    )
    family = getattr(source, "model_type", None)
    if family == "qwen2":
        fields |= dict(attention_bias=True, attention_output_bias=False)  # biased q/k/v, unbiased o
    elif family == "qwen3":
        fields |= dict(qk_norm="per_head")
    elif family == "olmoe":
        fields |= dict(qk_norm="full", clip_qkv=source.clip_qkv)
    experts = num_experts(source)
    if experts:
        fields |= dict(
            num_experts=experts,
            num_experts_per_tok=source.num_experts_per_tok,
            # OLMoE's and Mixtral's intermediate_size is the expert width; Qwen3-MoE names it apart
            moe_intermediate_size=getattr(source, "moe_intermediate_size", None) or source.intermediate_size,
            norm_topk_prob=bool(getattr(source, "norm_topk_prob", False)),
            router_aux_loss_coef=getattr(source, "router_aux_loss_coef", 0.01),
            output_router_logits=bool(getattr(source, "output_router_logits", False)),
        )
    return fields


def num_experts(config: PreTrainedConfig) -> int:
    """Experts per MoE layer of a HiRes or any transformers config; 0 for a dense model. The one MoE check:
    families name the field differently (HiRes, OLMoE, Qwen3-MoE `num_experts`; Mixtral `num_local_experts`)."""
    return int(getattr(config, "num_experts", 0) or getattr(config, "num_local_experts", 0) or 0)


def _require_twin(ok: bool, config: HiResConfig, family: str) -> None:
    if not ok:
        raise ValueError(
            f"No transformers twin for this HiRes layer (qk_norm={config.qk_norm!r}, num_experts={config.num_experts},"
            f" attention_bias={config.attention_bias}, attention_output_bias={config.attention_output_bias},"
            f" mlp_bias={config.mlp_bias}, clip_qkv={config.clip_qkv}): the matching family would be {family}."
        )


def scale_twin_embedding(model: nn.Module, multiplier: float) -> RemovableHandle:
    """Multiply a twin's token embeddings by `multiplier` in its forward, as HiRes's `embedding_multiplier` does.

    A control for training comparisons, not part of the twin: it asks how much of HiRes's lead over a plain
    transformers twin is only the embedding scale, which the twin could adopt too. Not saved with the model."""
    return model.get_input_embeddings().register_forward_hook(lambda module, inputs, output: output * multiplier)


__all__ = ["SHARED_FIELDS", "hires_layer_fields", "num_experts", "scale_twin_embedding", "vanilla_config"]
