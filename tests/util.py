"""Small builders shared by the core tests: vanilla transformers twins with perturbed weights, and the
function-preserving HiRes that holds them (docs/architecture.md, exact equivalence)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, OlmoeConfig, OlmoeForCausalLM, PreTrainedModel

from hires_hf import HiResConfig, HiResForCausalLM

VOCAB = 128


def llama(seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=88,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        pad_token_id=0,
    )
    return perturbed(LlamaForCausalLM(config), seed)


def olmoe(seed: int = 0) -> OlmoeForCausalLM:
    config = OlmoeConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=24,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_experts=6,
        num_experts_per_tok=2,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=VOCAB - 1,
    )
    return perturbed(OlmoeForCausalLM(config), seed)


def perturbed(model: PreTrainedModel, seed: int) -> PreTrainedModel:
    """Move every parameter off its initial value, so norms, routers and biases are not at defaults."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    return model.eval()


def exact_hires_config(vanilla: PreTrainedModel, residual_size: int, layers_per_block: int = 2) -> HiResConfig:
    """The HiRes config whose forward equals `vanilla`'s: identity read/write, delta writes, no outer norm."""
    v = vanilla.config
    is_moe = getattr(v, "num_experts", 0) > 0
    return HiResConfig(
        vocab_size=v.vocab_size,
        hidden_size=v.hidden_size,
        intermediate_size=v.intermediate_size,
        num_hidden_layers=v.num_hidden_layers,
        num_attention_heads=v.num_attention_heads,
        num_key_value_heads=v.num_key_value_heads,
        max_position_embeddings=v.max_position_embeddings,
        rope_parameters=dict(v.rope_parameters),
        rms_norm_eps=v.rms_norm_eps,
        pad_token_id=v.pad_token_id,
        eos_token_id=v.eos_token_id,
        qk_norm="full" if is_moe else None,
        num_experts=v.num_experts if is_moe else 0,
        num_experts_per_tok=v.num_experts_per_tok if is_moe else 0,
        moe_intermediate_size=v.intermediate_size if is_moe else None,
        residual_size=residual_size,
        layers_per_block=layers_per_block,
        projection_init="identity",
        write_mode="delta",
        outer_norm=False,
    )


def hires_from_vanilla(vanilla: PreTrainedModel, residual_size: int, layers_per_block: int = 2) -> HiResForCausalLM:
    """Copy a Llama / OLMoE into the function-preserving HiRes (the layers keep their names; layer l runs in block
    l // k)."""
    config = exact_hires_config(vanilla, residual_size, layers_per_block)
    hires = HiResForCausalLM(config).eval()
    state = {}
    for key, value in vanilla.state_dict().items():
        if key == "model.embed_tokens.weight":
            value = torch.nn.functional.pad(value, (0, residual_size - value.shape[1]))  # zero columns d..D
        state[key] = value
    missing, unexpected = hires.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(".read_proj." in m or ".write_proj." in m or "read_out" in m for m in missing), missing
    return hires


def tiny_hires(preset: str = "tiny", **overrides) -> HiResForCausalLM:
    config = HiResConfig.from_preset(preset, vocab_size=VOCAB, pad_token_id=0, eos_token_id=VOCAB - 1, **overrides)
    return perturbed(HiResForCausalLM(config), seed=1)
