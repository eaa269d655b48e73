"""The one mapping between HiRes and vanilla configs: HiRes -> twin -> HiRes gives back the same layers."""

import pytest

from hires_hf import HiResConfig
from hires_hf.twins import SHARED_FIELDS, hires_layer_fields, vanilla_config

LAYER_FIELDS = (
    *SHARED_FIELDS,
    "intermediate_size",
    "attention_bias",
    "attention_output_bias",
    "mlp_bias",
    "qk_norm",
    "clip_qkv",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "router_aux_loss_coef",
)

# One HiRes layer variant per transformers family its twin belongs to.
FAMILIES = {
    "llama": ("LlamaConfig", {"attention_bias": True, "attention_output_bias": True, "mlp_bias": True}),
    "qwen2": ("Qwen2Config", {"attention_bias": True}),
    "qwen3": ("Qwen3Config", {"qk_norm": "per_head"}),
    "olmoe": ("OlmoeConfig", {"qk_norm": "full", "num_experts": 4, "num_experts_per_tok": 2, "clip_qkv": 8.0}),
}


@pytest.mark.parametrize("family, fields", FAMILIES.values(), ids=FAMILIES.keys())
def test_the_twin_maps_back_to_the_same_layers(family: str, fields: dict) -> None:
    hires = HiResConfig.from_preset("tiny", **fields)
    twin = vanilla_config(hires)
    assert type(twin).__name__ == family
    back = HiResConfig(**hires_layer_fields(twin), residual_size=hires.residual_size, layers_per_block=2)
    # an MoE layer has no dense FFN: its twin keeps only the expert width
    compared = [name for name in LAYER_FIELDS if not (hires.is_moe and name == "intermediate_size")]
    assert {name: getattr(back, name) for name in compared} == {name: getattr(hires, name) for name in compared}
