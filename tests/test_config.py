"""HiResConfig: presets, derived values, and one clear error per invalid field (docs/architecture.md, invariant 6)."""

import json

import pytest
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig

from hires_hf import PRESETS, HiResConfig

# (overrides on the tiny preset, the field the error must name, a fragment of what is allowed)
INVALID = {
    "residual-narrower-than-layer": ({"residual_size": 32}, "residual_size=32", ">= hidden_size (64)"),
    "layers-not-divisible-by-k": ({"layers_per_block": 3}, "layers_per_block=3", "divisor of num_hidden_layers (4)"),
    "k-zero": ({"layers_per_block": 0}, "layers_per_block=0", "positive integer"),
    "unknown-write-mode": ({"write_mode": "sum"}, "write_mode='sum'", "'output', 'delta'"),
    "unknown-projection-init": ({"projection_init": "zeros"}, "projection_init='zeros'", "'normal', 'identity'"),
    "unknown-qk-norm": ({"qk_norm": "layer"}, "qk_norm='layer'", "'per_head', 'full'"),
    "tied-with-wider-stream": ({"tie_word_embeddings": True}, "tie_word_embeddings=True", "residual_size (128)"),
    "top-k-above-experts": (
        {"num_experts": 4, "num_experts_per_tok": 5, "moe_intermediate_size": 32},
        "num_experts_per_tok=5",
        "[1, num_experts=4]",
    ),
    "moe-top-k-zero": ({"num_experts": 4, "num_experts_per_tok": 0}, "num_experts_per_tok=0", "[1, num_experts=4]"),
    "negative-experts": ({"num_experts": -1}, "num_experts=-1", "0 (dense)"),
    "heads-not-dividing-width": (
        {"num_attention_heads": 3, "num_key_value_heads": 3},
        "num_attention_heads=3",
        "divisor",
    ),
    "kv-heads-not-dividing-heads": ({"num_key_value_heads": 3}, "num_key_value_heads=3", "divisor of num_attention"),
    "odd-head-dim": ({"head_dim": 15}, "head_dim=15", "even"),
    "negative-aux-coef": ({"router_aux_loss_coef": -0.1}, "router_aux_loss_coef=-0.1", ">= 0"),
    "non-positive-clip": ({"clip_qkv": 0.0}, "clip_qkv=0.0", "positive"),
}


@pytest.mark.parametrize("overrides, field, allowed", INVALID.values(), ids=INVALID.keys())
def test_invalid_config_names_field_value_and_allowed(overrides: dict, field: str, allowed: str) -> None:
    with pytest.raises((ValueError, StrictDataclassError)) as excinfo:
        HiResConfig.from_preset("tiny", **overrides)
    # strict validation wraps our ValueError; the user sees both, the cause carries the sentence
    message = str(excinfo.value.__cause__ or excinfo.value)
    assert field in message
    assert allowed in message


def test_invalid_config_also_refused_when_loading_a_file(tmp_path) -> None:
    fields = HiResConfig.from_preset("tiny").to_dict() | {"residual_size": 16}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    with pytest.raises((ValueError, StrictDataclassError), match="residual_size=16"):
        AutoConfig.from_pretrained(tmp_path)


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="tiny"):
        HiResConfig.from_preset("huge")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build_and_derive_blocks(name: str) -> None:
    config = HiResConfig.from_preset(name)
    assert config.num_blocks * config.layers_per_block == config.num_hidden_layers
    assert config.residual_size >= config.hidden_size


def test_defaults_follow_the_spec() -> None:
    config = HiResConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=8)
    assert config.residual_size == 128  # D = 2d
    assert config.layers_per_block == 4
    assert (config.write_mode, config.outer_norm, config.projection_init) == ("output", True, "normal")
    assert config.head_dim == 16 and config.num_key_value_heads == 4
    assert not config.is_moe
    assert config.router_aux_loss_coef == 0.0  # nothing to balance: tools (TRL) read a non-zero value as "MoE"
    assert config.embedding_size == 128  # the embedding is D wide; vLLM sizes it from this name
    moe = HiResConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=8, num_experts=4, num_experts_per_tok=2)
    assert moe.router_aux_loss_coef == 0.01 and moe.moe_intermediate_size == moe.intermediate_size


def test_olmoe_preset_has_the_released_shape() -> None:
    config = HiResConfig.from_preset("olmoe-1b-7b")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.head_dim) == (
        16,
        2048,
        16,
        128,
    )
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (64, 8, 1024)
    assert (config.vocab_size, config.max_position_embeddings, config.qk_norm) == (50304, 4096, "full")
    assert (config.router_aux_loss_coef, config.router_z_loss_coef, config.norm_topk_prob) == (0.01, 0.001, False)
    assert config.rope_parameters["rope_theta"] == 10000.0 and not config.tie_word_embeddings


def test_config_round_trips_through_json(tmp_path) -> None:
    config = HiResConfig.from_preset("tiny-moe", write_mode="delta", outer_norm=False)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, HiResConfig)
    for field in ("residual_size", "layers_per_block", "write_mode", "outer_norm", "num_experts", "qk_norm"):
        assert getattr(loaded, field) == getattr(config, field)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["auto_map"]["AutoConfig"] == "configuration_hires.HiResConfig"
