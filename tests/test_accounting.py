"""Cost accounting (docs/architecture.md): parameter counts equal the models', counted FLOPs equal what torch counts."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

from hires_hf import HiResConfig, HiResForCausalLM
from hires_hf.accounting import count_parameters, forward_flops_per_token, hires_flops_overhead
from hires_hf.twins import vanilla_config

CONFIGS = {
    "dense": {},
    "moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "qk_norm": "full"},
    "gqa-bias-qwen2": {"attention_bias": True, "num_key_value_heads": 1},
    "per-head-norm-tied": {"qk_norm": "per_head", "residual_size": 64, "tie_word_embeddings": True},
    "no-outer-norm-wide": {"outer_norm": False, "residual_size": 256, "layers_per_block": 4},
}


def tiny(**overrides) -> HiResConfig:
    return HiResConfig.from_preset("tiny", vocab_size=300, **overrides)


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_parameter_count_matches_the_model(overrides: dict) -> None:
    config = tiny(**overrides)
    assert count_parameters(config) == HiResForCausalLM(config).num_parameters()


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_vanilla_parameter_count_matches_the_transformers_twin(overrides: dict) -> None:
    config = tiny(**overrides)
    twin = AutoModelForCausalLM.from_config(vanilla_config(config))
    assert count_parameters(config, vanilla=True) == twin.num_parameters()


@pytest.mark.parametrize("overrides", [CONFIGS["dense"], CONFIGS["moe"], CONFIGS["gqa-bias-qwen2"]], ids=str)
def test_counted_flops_match_flop_counter(overrides: dict) -> None:
    # eager attention and eager experts: their matmuls are what FlopCounterMode sees (sdpa / grouped_mm are not
    # counted on CPU); a dense kernel multiplies the full T x T score matrix, hence causal=False.
    config = tiny(**overrides)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", experts_implementation="eager")
    batch, seq_len = 2, 24
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randint(0, config.vocab_size, (batch, seq_len)))
    measured = counter.get_total_flops() / (batch * seq_len)
    predicted = forward_flops_per_token(config, seq_len, causal=False)
    # Every matmul the counter sees is in the analytic count, so they agree exactly. A looser tolerance would hide
    # a dropped term: the MoE router (2 d E FLOPs per layer and token) is only ~0.5% of this model's forward.
    assert measured == pytest.approx(predicted, rel=1e-9)


def test_overhead_matches_the_spec_example() -> None:
    """docs/architecture.md: dense, I = 8d/3, MHA, D = 2d: ~4d^2 extra per 48d^2 of layer work at k = 4 (8%),
    ~4% at k = 8."""
    d = 768
    common = dict(hidden_size=d, intermediate_size=8 * d // 3, num_attention_heads=12, vocab_size=1)
    k4 = HiResConfig(num_hidden_layers=16, layers_per_block=4, **common)
    k8 = HiResConfig(num_hidden_layers=16, layers_per_block=8, **common)
    # short context so attention scores are negligible, as in the spec's estimate; the read-out adds a little
    assert hires_flops_overhead(k4, seq_len=1) == pytest.approx(4 / 48 + 1 / 96, rel=0.05)
    assert hires_flops_overhead(k8, seq_len=1) == pytest.approx(2 / 48 + 1 / 96, rel=0.05)


def test_causal_flops_are_below_full_context_flops() -> None:
    config = tiny()
    assert forward_flops_per_token(config, 512) < forward_flops_per_token(config, 512, causal=False)
    assert forward_flops_per_token(config, 512, vanilla=True) < forward_flops_per_token(config, 512)
