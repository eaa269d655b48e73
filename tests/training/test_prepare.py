"""Prepared data (`hires_hf.training.prepare`): the spec a run record stores, and the cache that must give the
very same blocks back (a ladder worker started tomorrow must train on the tokens today's did)."""

from __future__ import annotations

import torch

from hires_hf.training.prepare import prepare_data


def test_cached_blocks_are_the_prepared_ones_and_the_spec_says_so(tmp_path):
    first = prepare_data("stdlib", 300, 32, max_chars=150_000, eval_blocks=4, progress=False, cache_dir=tmp_path)
    (folder,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]  # written whole, no staging left
    assert (folder / "blocks.safetensors").exists() and (folder / "tokenizer.json").exists()
    again = prepare_data("stdlib", 300, 32, max_chars=150_000, eval_blocks=4, progress=False, cache_dir=tmp_path)
    assert torch.equal(first.train, again.train) and torch.equal(first.validation, again.validation)
    assert again.spec == first.spec and again.unigram_loss == first.unigram_loss
    assert again.tokenizer.encode("def f(x):") == first.tokenizer.encode("def f(x):")
    other = prepare_data("stdlib", 300, 32, max_chars=100_000, eval_blocks=4, progress=False, cache_dir=tmp_path)
    assert other.spec["tokens_sha256"] != first.spec["tokens_sha256"]  # other text: another spec, another key
