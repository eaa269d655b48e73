"""HiResConfig: presets, derived values, and one clear error per invalid field (docs/architecture.md, invariant 6)."""

import json

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, OlmoeConfig

from hires_hf import PRESETS, HiResConfig, HiResForCausalLM
from hires_hf.accounting import count_parameters
from hires_hf.configuration_hires import WRITE_BASE_WIDTH
from hires_hf.loading import with_overrides
from hires_hf.twins import vanilla_config

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
def test_presets_build_a_model_whose_blocks_hold_every_layer(name: str) -> None:
    """Every preset builds (on the meta device: no memory), with its layers split into blocks of k in order, and
    the parameter count the accounting reports (what `hires-hf info` prints)."""
    config = HiResConfig.from_preset(name)
    with torch.device("meta"):
        model = HiResForCausalLM(config)
    blocks, layers = model.model.blocks, model.model.layers
    assert len(blocks) == config.num_blocks and len(layers) == config.num_hidden_layers
    runs = [index for block in blocks for index in block.layer_range]
    assert runs == list(range(config.num_hidden_layers))  # block b runs layers b*k .. b*k+k-1, each once
    assert {len(block.layer_range) for block in blocks} == {config.layers_per_block}
    assert [layer.self_attn.layer_idx for layer in layers] == runs  # the KV cache's index is the layer's own
    assert sum(param.numel() for param in model.parameters()) == count_parameters(config)


def test_defaults_follow_the_spec() -> None:
    config = HiResConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=8)
    assert config.residual_size == 128  # D = 2d
    assert config.layers_per_block == 4
    assert (config.write_mode, config.outer_norm, config.projection_init) == ("output", True, "identity")
    assert config.head_dim == 16 and config.num_key_value_heads == 4
    assert not config.is_moe
    assert config.router_aux_loss_coef == 0.0  # nothing to balance: tools (TRL) read a non-zero value as "MoE"
    assert config.embedding_size == 128  # the embedding is D wide; vLLM sizes it from this name
    moe = HiResConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=8, num_experts=4, num_experts_per_tok=2)
    assert moe.router_aux_loss_coef == 0.01 and moe.moe_intermediate_size == moe.intermediate_size


def test_olmoe_preset_is_transformers_olmoe_1b_7b_made_hires() -> None:
    """The preset's layers are transformers' OLMoE-1B-7B config (its defaults, but for the expert width: the
    released model uses 1024, `OlmoeConfig` defaults to 2048), plus D = 2d, k = 4 and the z-loss it trained with."""
    config = HiResConfig.from_preset("olmoe-1b-7b")
    released = OlmoeConfig(intermediate_size=1024, head_dim=128)  # head_dim None means 2048 / 16 there
    ignored = {"transformers_version", "_name_or_path"}
    twin = {key: value for key, value in vanilla_config(config).to_dict().items() if key not in ignored}
    assert twin == {key: value for key, value in released.to_dict().items() if key not in ignored}
    assert (config.residual_size, config.layers_per_block, config.router_z_loss_coef) == (4096, 4, 0.001)


def test_config_round_trips_through_json(tmp_path) -> None:
    config = HiResConfig.from_preset("tiny-moe", write_mode="delta", outer_norm=False)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, HiResConfig)
    for field in ("residual_size", "layers_per_block", "write_mode", "outer_norm", "num_experts", "qk_norm"):
        assert getattr(loaded, field) == getattr(config, field)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["auto_map"]["AutoConfig"] == "configuration_hires.HiResConfig"


# ------------------------------------------------------------------ derived defaults follow the final values
# What a user changes (one field) and what the fields left to their default must then be, on the tiny preset
# (d = 64, outer norm on: write multiplier WRITE_BASE_WIDTH / 64, embedding multiplier 1 / 0.02 = 50, write norm on).
CHANGES = {
    "outer-norm-off": (
        {"outer_norm": False},
        {"write_norm": False, "write_multiplier": 1.0, "embedding_multiplier": 1.0},
    ),
    "wider-layers": (
        {"hidden_size": 128},
        {"write_multiplier": WRITE_BASE_WIDTH / 128, "head_dim": 32, "write_norm": True},
    ),
    "other-init": ({"initializer_range": 0.04}, {"embedding_multiplier": 25.0}),
    "experts": (
        {"num_experts": 4, "num_experts_per_tok": 2},
        {"router_aux_loss_coef": 0.01, "moe_intermediate_size": 172},
    ),
}


def _override_items(change: dict) -> list[str]:
    return [f"{field}={json.dumps(value)}" for field, value in change.items()]


def _rebuilt_by(path: str, change: dict, tmp_path) -> HiResConfig:
    """The tiny preset with `change` applied the way each part of the package applies one."""
    tiny = HiResConfig.from_preset("tiny")
    if path == "cli-override":  # hires-hf train --model tiny --override FIELD=VALUE
        return with_overrides(tiny, _override_items(change))
    if path == "to-dict-rebuild":  # the converter, the ladder, the Trainer's plain copy
        return HiResConfig.from_dict({**tiny.to_dict(), **change})
    if path == "hand-edited-config-json":  # a saved config.json edited by hand, then loaded
        tiny.save_pretrained(tmp_path)
        saved = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**saved, **change}))
        return AutoConfig.from_pretrained(tmp_path)
    if path == "assignment":  # config.field = value after construction
        for field, value in change.items():
            setattr(tiny, field, value)
        return tiny
    raise AssertionError(path)


PATHS = ["cli-override", "to-dict-rebuild", "hand-edited-config-json", "assignment"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("change, expected", CHANGES.values(), ids=CHANGES.keys())
def test_a_changed_field_rederives_the_defaults_that_depend_on_it(path: str, change: dict, expected: dict, tmp_path):
    config = _rebuilt_by(path, change, tmp_path)
    assert {field: getattr(config, field) for field in expected} == expected
    # and it is the config from_preset builds with the same change in one go
    assert config.to_dict() | {"_name_or_path": ""} == HiResConfig.from_preset("tiny", **change).to_dict() | {
        "_name_or_path": ""
    }


@pytest.mark.parametrize("path", PATHS)
def test_an_explicit_value_wins_on_every_path(path: str, tmp_path) -> None:
    """A value the user chose is kept, whatever else changes, and survives save / load."""
    pinned = {"write_multiplier": 0.5, "embedding_multiplier": 3.0, "write_norm": False, "head_dim": 8}
    config = HiResConfig.from_preset("tiny", **pinned)
    config.save_pretrained(tmp_path / "saved")
    loaded = AutoConfig.from_pretrained(tmp_path / "saved")
    assert {field: getattr(loaded, field) for field in pinned} == pinned
    change = {"outer_norm": False, "hidden_size": 128}
    if path == "cli-override":
        rebuilt = with_overrides(loaded, _override_items(change))
    elif path == "to-dict-rebuild":
        rebuilt = HiResConfig.from_dict({**loaded.to_dict(), **change})
    elif path == "hand-edited-config-json":
        saved = json.loads((tmp_path / "saved" / "config.json").read_text())
        (tmp_path / "saved" / "config.json").write_text(json.dumps({**saved, **change}))
        rebuilt = AutoConfig.from_pretrained(tmp_path / "saved")
    else:
        rebuilt = loaded
        for field, value in change.items():
            setattr(rebuilt, field, value)
    assert {field: getattr(rebuilt, field) for field in pinned} == pinned


def test_a_saved_config_json_says_which_values_are_derived(tmp_path) -> None:
    """null in config.json means "derived from this file's other fields"; a number means "chosen"."""
    HiResConfig.from_preset("tiny", write_multiplier=0.5).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["write_multiplier"] == 0.5
    assert saved["embedding_multiplier"] is None and saved["write_norm"] is None and saved["head_dim"] is None
    assert saved["residual_size"] == 128  # the preset chose it


def test_from_preset_derives_from_the_overrides_and_assigning_none_hands_a_field_back() -> None:
    config = HiResConfig.from_preset("tiny", outer_norm=False, write_multiplier=0.5)
    assert (config.write_multiplier, config.embedding_multiplier, config.write_norm) == (0.5, 1.0, False)
    config.write_multiplier = None  # back to its default, derived from outer_norm=False
    config.outer_norm = True
    assert (config.write_multiplier, config.embedding_multiplier, config.write_norm) == (
        WRITE_BASE_WIDTH / 64,
        50.0,
        True,
    )
