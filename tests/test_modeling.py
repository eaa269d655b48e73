"""The model's behaviour: exact equivalence with vanilla (docs/architecture.md), caches, padding, backends, training
paths and MoE routing losses (the invariants of docs/architecture.md)."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.integrations.moe import ExpertsInterface, batched_mm_experts_forward

from hires_hf import HiResConfig, HiResForCausalLM, HiResForSequenceClassification, HiResModel
from hires_hf.modeling_hires import load_balancing_loss, router_z_loss
from tests.util import VOCAB, hires_from_vanilla, llama, olmoe, perturbed, tiny_hires

FAMILIES = {"llama": llama, "olmoe": olmoe}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ---------------------------------------------------------------- equivalence with transformers' own models
@pytest.mark.parametrize("residual_size", [32, 80], ids=["D=d", "D>d"])
@pytest.mark.parametrize("family", FAMILIES)
def test_function_preserving_hires_equals_vanilla(family: str, residual_size: int) -> None:
    vanilla = FAMILIES[family]()
    hires = hires_from_vanilla(vanilla, residual_size)
    ids = torch.randint(1, VOCAB, (3, 17))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding on one row
    with torch.no_grad():
        expected = vanilla(ids, attention_mask=mask).logits
        got = hires(ids, attention_mask=mask).logits
    assert max_diff(got, expected) < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_equivalence_survives_block_size(family: str) -> None:
    vanilla = FAMILIES[family]()
    ids = torch.randint(1, VOCAB, (2, 9))
    with torch.no_grad():
        expected = vanilla(ids).logits
        for k in (1, 4):
            assert max_diff(hires_from_vanilla(vanilla, 64, layers_per_block=k)(ids).logits, expected) < 1e-4


def test_perturbed_projections_break_equivalence() -> None:
    """The equivalence test can fail: a model that ignores read/write would pass it for the wrong reason."""
    vanilla = llama()
    hires = hires_from_vanilla(vanilla, 48)
    with torch.no_grad():
        hires.model.blocks[1].write_proj.weight[0, 0] += 0.5
        ids = torch.randint(1, VOCAB, (1, 8))
        assert max_diff(hires(ids).logits, vanilla(ids).logits) > 1e-3


# ---------------------------------------------------------------- caches and generation
@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_cached_forward_equals_full_forward(preset: str) -> None:
    model = tiny_hires(preset)
    ids = torch.randint(1, VOCAB, (2, 12))
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        first = model(ids[:, :7], cache=cache, use_cache=True)
        rest = model(ids[:, 7:], cache=first.cache, use_cache=True)
    assert len(rest.cache.layers) == model.config.num_hidden_layers  # one d-wide entry per layer
    assert rest.cache.layers[0].keys.shape[-1] == model.config.head_dim
    assert max_diff(torch.cat([first.logits, rest.logits], dim=1), full) < 1e-4


def test_deprecated_past_key_values_keyword_is_honoured() -> None:
    model = tiny_hires()
    ids = torch.randint(1, VOCAB, (1, 10))
    with torch.no_grad():
        full = model(ids).logits
        first = model(ids[:, :6], use_cache=True)
        rest = model(ids[:, 6:], past_key_values=first.cache, use_cache=True)
    assert max_diff(rest.logits, full[:, 6:]) < 1e-4


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_greedy_generation_with_cache_equals_without(preset: str) -> None:
    model = tiny_hires(preset)
    prompt = torch.randint(1, VOCAB - 1, (2, 5))
    kwargs = dict(max_new_tokens=8, do_sample=False, output_scores=True, return_dict_in_generate=True)
    cached = model.generate(prompt, attention_mask=torch.ones_like(prompt), use_cache=True, **kwargs)
    uncached = model.generate(prompt, attention_mask=torch.ones_like(prompt), use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert max(max_diff(a, b) for a, b in zip(cached.scores, uncached.scores)) < 1e-4


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_left_padded_batch_generation_equals_single(preset: str) -> None:
    model = tiny_hires(preset)
    prompts = [torch.randint(1, VOCAB - 1, (n,)) for n in (7, 3, 5)]
    width = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([torch.zeros(width - len(p), dtype=torch.long), p]) for p in prompts])
    mask = (torch.arange(width)[None] >= width - torch.tensor([len(p) for p in prompts])[:, None]).long()
    batched = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    for row, prompt in enumerate(prompts):
        alone = model.generate(
            prompt[None], attention_mask=torch.ones(1, len(prompt)), max_new_tokens=6, do_sample=False
        )
        assert torch.equal(batched[row, width:], alone[0, len(prompt) :])


# ---------------------------------------------------------------- attention backends
@pytest.fixture(scope="module")
def backend_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    return ids, mask


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sdpa", "flex_attention"])
def test_attention_backends_agree_with_eager(backend: str, backend_inputs) -> None:
    ids, mask = backend_inputs
    model = tiny_hires()
    with torch.no_grad():
        model.set_attn_implementation("eager")
        expected = model(ids, attention_mask=mask).logits
        model.set_attn_implementation(backend)
        got = model(ids, attention_mask=mask).logits
    keep = mask.bool()  # padded positions attend to nothing; their logits are not compared
    assert max_diff(got[keep], expected[keep]) < 1e-4


# ---------------------------------------------------------------- training paths
def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    ids = torch.randint(1, VOCAB, (2, 12))
    state = tiny_hires("tiny-moe").state_dict()

    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = tiny_hires("tiny-moe", output_router_logits=True).train()
        model.load_state_dict(state)
        if checkpointing:
            model.activation_checkpointing_enable()
            assert all(layer.gradient_checkpointing for layer in model.model.layers)
        model(ids, labels=ids).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = grads(False), grads(True)
    assert plain.keys() == checkpointed.keys() and len(plain) > 0
    assert max(max_diff(plain[name], checkpointed[name]) for name in plain) < 1e-5


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_bf16_forward_and_backward_stay_finite(preset: str) -> None:
    model = tiny_hires(preset).to(torch.bfloat16).train()
    ids = torch.randint(1, VOCAB, (2, 12))
    out = model(ids, labels=ids)
    out.loss.backward()
    assert out.logits.dtype == torch.bfloat16
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_loss_honours_num_items_in_batch() -> None:
    """The Trainer passes num_items_in_batch under gradient accumulation: the sum is divided by it instead."""
    model = tiny_hires()
    ids = torch.randint(1, VOCAB, (2, 10))
    with torch.no_grad():
        mean = model(ids, labels=ids).loss
        summed = model(ids, labels=ids, num_items_in_batch=torch.tensor(1)).loss
    assert torch.allclose(summed, mean * 2 * 9, rtol=1e-4)


def test_outputs_record_hidden_states_and_attentions() -> None:
    model = tiny_hires()
    model.set_attn_implementation("eager")
    out = model(torch.randint(1, VOCAB, (1, 6)), output_hidden_states=True, output_attentions=True)
    layers = model.config.num_hidden_layers
    assert len(out.hidden_states) == layers + 1 and len(out.attentions) == layers
    assert all(h.shape[-1] == model.config.hidden_size for h in out.hidden_states)  # layer states are d-wide
    assert out.attentions[0].shape == (1, model.config.num_attention_heads, 6, 6)


def test_sequence_classification_scores_the_last_real_token() -> None:
    config = HiResConfig.from_preset("tiny", vocab_size=VOCAB, pad_token_id=0, num_labels=3)
    model = HiResForSequenceClassification(config).eval()
    ids = torch.randint(1, VOCAB, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)  # right padding
    with torch.no_grad():
        alone = model(ids).logits
        with_pad = model(padded, attention_mask=(padded != 0).long()).logits
    assert alone.shape == (1, 3)
    assert max_diff(alone, with_pad) < 1e-5


def test_embedding_is_wide_and_head_is_narrow() -> None:
    model = tiny_hires()
    config = model.config
    assert model.get_input_embeddings().weight.shape == (VOCAB, config.residual_size)
    assert model.get_output_embeddings().weight.shape == (VOCAB, config.hidden_size)
    assert isinstance(model.get_decoder(), HiResModel)


def test_tied_embeddings_share_storage_when_widths_match() -> None:
    config = HiResConfig.from_preset("tiny", vocab_size=VOCAB, residual_size=64, tie_word_embeddings=True)
    model = HiResForCausalLM(config)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


# ---------------------------------------------------------------- mixture of experts
def test_router_logits_are_recorded_per_layer() -> None:
    model = tiny_hires("tiny-moe")
    ids = torch.randint(1, VOCAB, (2, 7))
    out = model(ids, output_router_logits=True)
    assert len(out.router_logits) == model.config.num_hidden_layers
    assert all(r.shape == (2 * 7, model.config.num_experts) for r in out.router_logits)
    assert model(ids).router_logits is None  # off by default (config.output_router_logits=False)


@pytest.mark.parametrize("aux_coef, z_coef", [(0.0, 0.0), (0.5, 0.0), (0.0, 0.25), (0.1, 0.01)])
def test_router_losses_enter_the_loss_with_their_coefficients(aux_coef: float, z_coef: float) -> None:
    model = tiny_hires("tiny-moe", router_aux_loss_coef=aux_coef, router_z_loss_coef=z_coef)
    ids = torch.randint(1, VOCAB, (2, 9))
    with torch.no_grad():
        lm_only = model(ids, labels=ids).loss
        out = model(ids, labels=ids, output_router_logits=True)
    assert out.aux_loss > 0 and out.z_loss > 0
    assert torch.allclose(out.loss, lm_only + aux_coef * out.aux_loss + z_coef * out.z_loss, atol=1e-6)


def test_load_balancing_loss_matches_olmoe() -> None:
    from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func

    logits = tuple(torch.randn(10, 6) for _ in range(3))
    mask = torch.ones(2, 5)
    mask[0, :2] = 0
    for m in (None, mask):
        assert torch.allclose(load_balancing_loss(logits, 2, m), load_balancing_loss_func(logits, 6, 2, m), atol=1e-6)


def test_z_loss_is_mean_squared_logsumexp() -> None:
    logits = (torch.zeros(4, 8), torch.zeros(4, 8))
    assert torch.allclose(router_z_loss(logits), torch.tensor(8.0).log() ** 2)


def moe_and_eager_twin(implementation: str) -> tuple[HiResForCausalLM, HiResForCausalLM]:
    """A tiny MoE on `implementation` with perturbed weights (routing far from uniform, experts far apart), and an
    eager copy. Each has its own config: `from_config` writes the choice into the config it is given, and the
    experts read it at every forward, so two models sharing one config would both run the last choice."""
    config = HiResConfig.from_preset("tiny-moe", vocab_size=VOCAB)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), experts_implementation=implementation)
    perturbed(model, seed=2)
    reference = AutoModelForCausalLM.from_config(copy.deepcopy(config), experts_implementation="eager").eval()
    reference.load_state_dict(model.state_dict())
    return model, reference


@pytest.mark.parametrize("implementation", ["eager", "batched_mm", "grouped_mm"])
def test_requested_experts_implementation_is_used_and_agrees(implementation: str) -> None:
    model, reference = moe_and_eager_twin(implementation)
    assert model.config._experts_implementation == implementation  # still, with the eager twin built
    assert reference.config._experts_implementation == "eager"
    ids = torch.randint(1, VOCAB, (2, 8))
    with torch.no_grad():
        assert max_diff(model(ids).logits, reference(ids).logits) < 1e-5


def unweighted_experts(self, hidden_states, top_k_index, top_k_weights):
    """A broken kernel: every chosen expert weighted 1/K, whatever the router said."""
    uniform = torch.full_like(top_k_weights, 1.0 / top_k_weights.shape[-1])
    return batched_mm_experts_forward(self, hidden_states, top_k_index, uniform)


def off_by_one_experts(self, hidden_states, top_k_index, top_k_weights):
    """A broken kernel: each token sent to the expert next to the one it was routed to."""
    return batched_mm_experts_forward(self, hidden_states, (top_k_index + 1) % self.num_experts, top_k_weights)


@pytest.mark.parametrize("kernel", [unweighted_experts, off_by_one_experts], ids=lambda kernel: kernel.__name__)
def test_agreement_check_catches_a_broken_experts_kernel(kernel) -> None:
    """Negative control for the test above: its 1e-5 bound, on these weights, fails a kernel that is wrong."""
    name = f"hires_test_{kernel.__name__}"
    ExpertsInterface.register(name, kernel)
    model, reference = moe_and_eager_twin(name)
    ids = torch.randint(1, VOCAB, (2, 8))
    with torch.no_grad():
        assert max_diff(model(ids).logits, reference(ids).logits) > 1e-2


def test_grouped_mm_is_the_default_experts_kernel() -> None:
    model = AutoModelForCausalLM.from_config(HiResConfig.from_preset("tiny-moe"))
    assert model.config._experts_implementation == "grouped_mm"


def test_forward_return_annotations_are_the_output_classes_not_strings() -> None:
    """The Hub files carry no `from __future__ import annotations`: tools that read `forward`'s raw return annotation
    (which outputs a model can record: router logits among them) see the class itself."""
    import inspect
    from pathlib import Path

    from transformers.modeling_outputs import MoeModelOutputWithPast

    from hires_hf import configuration_hires, modeling_hires

    assert inspect.signature(HiResModel.forward).return_annotation is MoeModelOutputWithPast
    causal = inspect.signature(HiResForCausalLM.forward).return_annotation
    assert causal is modeling_hires.HiResCausalLMOutputWithPast and "router_logits" in causal.__dataclass_fields__
    for module in (modeling_hires, configuration_hires):
        assert "from __future__" not in Path(module.__file__).read_text()
