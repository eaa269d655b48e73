"""HiRes must not collapse onto the unigram plateau (docs/stability.md).

The mechanism: the outer PostNorms hold the wide stream at RMS ~1; a token embedding at the vanilla scale
(RMS = initializer_range) enters it ~50x smaller than what block 0 writes next to it, so the outer norms divide
the token identity away as soon as the blocks' writes grow a shared (token-independent) component, as they do
in the first steps when predicting the unigram distribution is the fastest gain. The stream then carries the
same vector for every token and the gradient to everything below it vanishes. The fix puts the embedding at the
stream's scale (`embedding_multiplier`); these tests pin the invariant and the behaviour it buys.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from hires_hf import HiResConfig
from hires_hf.diagnostics import stream_probe
from hires_hf.training import build_tokenizer, encode_documents, load_default_corpus, pack
from hires_hf.training.loop import LoopSettings, build_optimizer

VOCAB = 1024


@pytest.fixture(scope="module")
def text_blocks() -> torch.Tensor:
    """Real text (stdlib sources): its skewed unigram distribution is what pulls a model onto the plateau."""
    corpus = load_default_corpus(max_chars=400_000)
    tokenizer = build_tokenizer(corpus.train, vocab_size=VOCAB, sample_chars=200_000)
    return pack(encode_documents(tokenizer, corpus.train), 64, tokenizer.eos_token_id)


def four_blocks(**fields) -> HiResConfig:
    """d=64, D=128, 16 layers in 4 blocks: deep enough in blocks for the collapse to compound."""
    return HiResConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=16,
        num_attention_heads=2,
        layers_per_block=4,
        max_position_embeddings=128,
        **fields,
    )


def test_tokens_enter_the_wide_stream_at_the_scale_the_outer_norms_hold_it():
    """At initialisation the stream entering block 0 (the embedding) is as large as the stream between blocks."""
    model = AutoModelForCausalLM.from_config(four_blocks())
    units = stream_probe(model, torch.randint(2, VOCAB, (4, 32)))["units"]
    between = sum(unit["stream_rms"] for unit in units[1:]) / (len(units) - 1)
    assert 0.5 < units[0]["stream_rms"] / between < 2.0
    # block 0 adds to the tokens, it does not drown them (the vanilla-scale embedding was written over ~10x)
    assert units[0]["write_to_stream"] < 1.0


@pytest.mark.parametrize(("outer_norm", "rms"), [(False, 0.02), (True, 1.0)], ids=["additive-stream", "default"])
def test_a_config_without_outer_norm_keeps_the_vanilla_embedding_scale(outer_norm, rms):
    """An additive stream (exact conversion, ablations) is the vanilla stream: tokens enter it at the vanilla
    scale (RMS = initializer_range); with the outer norm they enter at the RMS the norms hold the stream at."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(four_blocks(outer_norm=outer_norm))
    embeds = model.get_input_embeddings()(torch.arange(2, VOCAB))  # what block 0 reads, multiplier included
    assert embeds.pow(2).mean().sqrt().item() == pytest.approx(rms, rel=0.1)


@pytest.mark.parametrize(
    ("fields", "collapses"),
    [({}, False), ({"embedding_multiplier": 1.0}, True)],
    ids=["default-keeps-tokens", "vanilla-scale-embedding-collapses"],
)
def test_the_stream_keeps_token_information_at_a_high_learning_rate(text_blocks, fields, collapses):
    """20 AdamW steps at lr 5e-3, no warmup: with the default embedding the stream between blocks stays token
    specific (shared fraction ~0.1); at the vanilla embedding scale it collapses to one vector for every token
    (~0.99)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(four_blocks(**fields))
    optimizer = build_optimizer(model, LoopSettings(steps=20, batch_size=16, learning_rate=5e-3))
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        batch = text_blocks[torch.randint(0, len(text_blocks), (16,), generator=generator)]
        model(input_ids=batch, labels=batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    units = stream_probe(model, text_blocks[:8])["units"]
    shared = sum(unit["stream_shared"] for unit in units[1:]) / (len(units) - 1)
    if collapses:
        assert shared > 0.95, shared
    else:
        assert shared < 0.5, shared


def _write_step(width: int, **fields) -> float:
    """RMS change of what block 1 adds to the wide stream, as the model computes it (before the outer norm),
    caused by one AdamW step of the write's own weights (everything else, and so the write's input, held fixed):
    how far one step at lr 1e-3 moves what the block adds to the normalised stream."""
    torch.manual_seed(0)
    config = HiResConfig(
        vocab_size=512,
        hidden_size=width,
        intermediate_size=8 * width // 3 // 8 * 8 + 8,
        num_hidden_layers=4,
        num_attention_heads=max(1, width // 32),
        layers_per_block=2,
        max_position_embeddings=64,
        **fields,
    )
    model = AutoModelForCausalLM.from_config(config)
    block = model.model.blocks[1]
    summed = []  # skip + write, what the outer norm receives
    block.outer_norm.register_forward_pre_hook(lambda _module, args: summed.append(args[0].detach()))
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    ids = torch.randint(0, 512, (8, 32), generator=torch.Generator().manual_seed(1))
    optimizer = build_optimizer(model, LoopSettings(steps=1, batch_size=8, learning_rate=1e-3))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    with torch.no_grad():  # keep only the write's step: block 1's input and its skip path are as before
        for name, param in model.named_parameters():
            if param is not block.write_proj.weight:
                param.copy_(before[name])
        model(input_ids=ids)
    moved = summed[1] - summed[0]
    return moved.pow(2).mean().sqrt().item()


@pytest.mark.parametrize(
    ("fields", "grows"),
    [({}, False), ({"write_multiplier": 1.0}, True)],
    ids=["default-width-independent", "unscaled-write-grows-with-width"],
)
def test_one_adam_step_moves_the_write_output_no_more_at_a_larger_width(fields, grows):
    """Adam moves every weight by ~lr, so an unscaled write's output moves ~lr * d per step: a learning rate that is
    safe at d=128 tips the normalised stream at d=512 (the GPU stall at lr 4e-3). The default multiplier
    (WRITE_BASE_WIDTH / d) keeps the step's effect from growing with the width, muP's rule for Adam."""
    ratio = _write_step(512, **fields) / _write_step(64, **fields)
    if grows:
        assert ratio > 3.0, ratio
    else:
        assert ratio < 1.5, ratio
