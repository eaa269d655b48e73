"""Sliding-window perplexity of a causal LM on a text.

The text is tokenized without special tokens and one prefix token (BOS, else EOS) is put in front, so the first
token is scored too. Each forward pass sees at most `window` tokens and scores the last `stride` of them (fewer
at the start); every token is scored exactly once, with `window - stride` tokens or more of context except near
the start. Windows are right-aligned: the last one ends at the end of the text and is full length.

With `stride == window` these are exactly lm-eval's `loglikelihood_rolling` windows at `max_length = window`,
so the two agree; a smaller stride gives every scored token more context (lower perplexity, more compute).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import torch
from tqdm.auto import tqdm


@dataclass(frozen=True)
class Perplexity:
    """Total negative log-likelihood (nats) of a text and what it is normalised by."""

    nll: float
    tokens: int
    bytes: int
    words: int
    window: int
    stride: int

    @property
    def perplexity(self) -> float:
        """Per token: exp(mean NLL)."""
        return math.exp(self.nll / self.tokens)

    @property
    def bits_per_byte(self) -> float:
        """Tokenizer-independent: comparable across vocabularies (lm-eval's `bits_per_byte`)."""
        return self.nll / self.bytes / math.log(2)

    @property
    def word_perplexity(self) -> float:
        """Per whitespace-separated word, as lm-eval counts words."""
        return math.exp(self.nll / self.words)

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "perplexity": self.perplexity,
            "bits_per_byte": self.bits_per_byte,
            "word_perplexity": self.word_perplexity,
        }


def windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first_scored) over the prefixed sequence s = [prefix] + tokens (length n_tokens + 1).

    The forward pass reads s[start:end] and scores tokens[first_scored:end] (token j is s[j + 1], predicted at
    position j of s). `end - start <= window` and `end - first_scored <= stride`.
    """
    if not 1 <= stride <= window:
        raise ValueError(f"stride must be between 1 and window ({window}); got {stride}.")
    spans = []
    for first in range(0, n_tokens, stride):
        end = min(first + stride, n_tokens)
        spans.append((max(0, end - window), end, first))
    return spans


def _prefix_token_id(tokenizer: Any, prefix_token_id: int | None) -> int:
    for candidate in (prefix_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return candidate
    raise ValueError("the tokenizer has neither a BOS nor an EOS token; pass prefix_token_id to score the first token.")


@torch.no_grad()
def sliding_window_perplexity(
    model: torch.nn.Module,
    tokenizer: Any,
    text: str,
    window: int | None = None,
    stride: int | None = None,
    batch_size: int = 1,
    prefix_token_id: int | None = None,
    progress: bool = True,
) -> Perplexity:
    """Perplexity of `text` (see the module docstring for the windows); `window` defaults to the model's context."""
    window = window or model.config.max_position_embeddings
    stride = stride or window
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not tokens:
        raise ValueError("the text is empty after tokenization; nothing to score.")
    sequence = torch.tensor([_prefix_token_id(tokenizer, prefix_token_id), *tokens])
    spans = windows(len(tokens), window, stride)
    device = next(model.parameters()).device
    nll = 0.0
    for i in tqdm(range(0, len(spans), batch_size), desc="perplexity", disable=not progress, unit="batch"):
        batch = spans[i : i + batch_size]
        length = max(end - start for start, end, _ in batch)
        input_ids = torch.zeros(len(batch), length, dtype=torch.long)  # right-padded: causal, so pads change nothing
        for row, (start, end, _) in enumerate(batch):
            input_ids[row, : end - start] = sequence[start:end]
        logits = model(input_ids=input_ids.to(device)).logits.float()  # (batch, length, vocab)
        log_probs = torch.log_softmax(logits, dim=-1)
        for row, (start, end, first) in enumerate(batch):
            positions = torch.arange(first - start, end - start, device=device)  # predict s[p + 1] at p
            targets = sequence[first + 1 : end + 1].to(device)
            nll -= log_probs[row, positions, targets].double().sum().item()
    return Perplexity(
        nll=nll,
        tokens=len(tokens),
        bytes=len(text.encode("utf-8")),
        words=len(re.split(r"\s+", text)),
        window=window,
        stride=stride,
    )


__all__ = ["Perplexity", "sliding_window_perplexity", "windows"]
