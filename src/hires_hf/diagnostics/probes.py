"""What a HiRes model does inside: the wide stream per block, the projections' spectra, attention entropy,
and, during training, each parameter group's gradient norm and update-to-weight ratio.

The quantity that matters most is the *shared fraction* of a set of token vectors: the share of their energy
that lies in their mean, i.e. in one direction common to every token. 0 means the vectors carry only
token-specific information, 1 means every token has the same vector: a stream at 1 can only predict the
unigram distribution (docs/stability.md explains why the PostNorm wide stream can fall there and stay).

Everything here works on HiRes models and on their vanilla twins (per layer instead of per block), so a run
and its twin can be put side by side.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

# Parameter groups in the order reports list them; the first pattern a name contains decides its group.
PARAM_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("embed", ("embed_tokens",)),
    ("read", ("read_proj",)),
    ("write", ("write_proj",)),
    ("read_out", ("read_out",)),
    ("outer_norm", ("outer_norm",)),
    ("attn", ("self_attn",)),
    ("mlp", ("mlp",)),
    ("head", ("lm_head", "score")),
)


def param_group(name: str) -> str:
    """The report group of a parameter name (`norm` for the layer norms and anything else)."""
    for group, patterns in PARAM_GROUPS:
        if any(pattern in name for pattern in patterns):
            return group
    return "norm"


def rms(x: torch.Tensor) -> float:
    return x.detach().float().pow(2).mean().sqrt().item()


def shared_fraction(x: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """Share of the energy of token vectors `x` (..., width) in their common mean: 0 token-specific, 1 identical."""
    flat = x.detach().float().reshape(-1, x.shape[-1])
    if mask is not None:
        flat = flat[mask.reshape(-1).bool()]
    mean = flat.mean(dim=0)
    return (mean.pow(2).sum() / flat.pow(2).sum(dim=-1).mean().clamp_min(1e-30)).item()


def _blocks(model: nn.Module) -> list[nn.Module] | None:
    """The HiRes blocks of a causal LM / base model, or None for a vanilla model."""
    base = getattr(model, "model", model)
    blocks = getattr(base, "blocks", None)
    return list(blocks) if blocks is not None else None


def _layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers, in order: `model.layers` for HiRes (flat, as Llama's) and vanilla models alike."""
    return list(getattr(model, "model", model).layers)


@torch.no_grad()
def stream_probe(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict:
    """One forward pass on `input_ids`, measuring per block (HiRes) or per layer (vanilla) what the stream holds.

    Per HiRes block: `stream_rms` / `stream_shared` of the wide stream entering it, `read_rms` of what it reads,
    `inner_rms` of its raw d-wide result (the inner residual stream after its last layer), `write_rms` /
    `write_shared` of what it adds to the stream (write multiplier included), and
    `write_to_stream`, the ratio of the write's RMS to the stream's: above ~1 the outer PostNorm shrinks
    everything the stream carried by that factor. `final_shared` is the shared fraction of the last hidden
    state (what the head sees).
    """
    was_training = model.training
    model.eval()
    records: list[dict[str, Any]] = []
    hooks = []
    blocks = _blocks(model)
    if blocks is not None:
        layers = _layers(model)
        for index, block in enumerate(blocks):
            hooks.append(block.register_forward_pre_hook(_block_input_hook(records, index, attention_mask)))
            hooks.append(layers[block.layer_range[-1]].register_forward_hook(_inner_hook(records)))
            multiplier = getattr(block, "write_multiplier", 1.0)
            hooks.append(block.write_proj.register_forward_hook(_write_hook(records, multiplier, attention_mask)))
    else:
        for index, layer in enumerate(_layers(model)):
            hooks.append(layer.register_forward_hook(_layer_output_hook(records, index, attention_mask)))
    final: list[float] = []
    base = getattr(model, "model", model)
    hooks.append(
        base.norm.register_forward_hook(lambda _m, _i, out: final.append(shared_fraction(out, attention_mask)))
    )
    try:
        model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return {"units": records, "final_shared": final[0], "kind": "block" if blocks is not None else "layer"}


def _block_input_hook(records: list[dict], index: int, mask: torch.Tensor | None):
    def hook(block: nn.Module, args: tuple) -> None:
        stream = args[0]
        records.append(
            {
                "block": index,
                "stream_rms": rms(stream),
                "stream_shared": shared_fraction(stream, mask),
                "read_rms": rms(block.read_proj(stream)),
            }
        )

    return hook


def _inner_hook(records: list[dict]):
    def hook(_module: nn.Module, _inputs: tuple, output: Any) -> None:
        records[-1]["inner_rms"] = rms(output if torch.is_tensor(output) else output[0])

    return hook


def _write_hook(records: list[dict], multiplier: float, mask: torch.Tensor | None):
    def hook(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
        record = records[-1]
        output = output * multiplier  # what the block adds to the stream
        record["write_rms"] = rms(output)
        record["write_shared"] = shared_fraction(output, mask)
        record["write_to_stream"] = record["write_rms"] / max(record["stream_rms"], 1e-30)

    return hook


def _layer_output_hook(records: list[dict], index: int, mask: torch.Tensor | None):
    def hook(_module: nn.Module, _inputs: tuple, output: Any) -> None:
        hidden = output if torch.is_tensor(output) else output[0]
        records.append({"layer": index, "stream_rms": rms(hidden), "stream_shared": shared_fraction(hidden, mask)})

    return hook


@torch.no_grad()
def attention_weights(model: nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each layer's attention weights (B, H, T, T) on `input_ids`, in eval mode: runs the eager kernel (the fused
    ones return no weights) and restores the model's kernel and mode."""
    previous = model.config._attn_implementation
    was_training = model.training
    model.eval()
    model.set_attn_implementation("eager")
    try:
        return model(input_ids=input_ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(previous)
        model.train(was_training)


@torch.no_grad()
def attention_entropy(model: nn.Module, input_ids: torch.Tensor) -> list[float]:
    """Mean attention entropy of each layer, as a fraction of the uniform distribution's over the causal context
    (1 = attends uniformly to everything before it, 0 = one token)."""
    attentions = attention_weights(model, input_ids)
    seq_len = input_ids.shape[-1]
    context = torch.arange(1, seq_len + 1, dtype=torch.float, device=input_ids.device)
    uniform = context.log().clamp_min(1e-9)  # entropy of uniform attention over each query's context
    entropies = []
    for probs in attentions:  # (B, H, T, T)
        ent = -(probs.float() * probs.float().clamp_min(1e-30).log()).sum(-1)  # (B, H, T)
        entropies.append((ent[..., 1:] / uniform[1:]).mean().item())  # the first query has a single choice
    return entropies


# Below this share of the uniform's entropy in every layer, each query attends to one token and the loss stalls at
# the bigram level (docs/stability.md, "A second stall"). On the ladder's 96x12 runs the collapsed ones had every
# layer below 0.15 by step 100 (0.10 at most by step 150); the healthy ones kept their most spread layer above 0.7.
COLLAPSED_ENTROPY = 0.15


def attention_collapsed(entropy: Sequence[float]) -> bool:
    """Whether the attention has collapsed: every layer's entropy (from `attention_entropy`) below
    `COLLAPSED_ENTROPY`. One sharp layer is normal (a previous-token head); all of them is the stall."""
    return bool(entropy) and max(entropy) < COLLAPSED_ENTROPY


def collapse_advice(entropy: Sequence[float]) -> str:
    """The line a user reads when `attention_collapsed(entropy)`: what it means and what to change."""
    return (
        f"the attention has collapsed: every layer's entropy is below {COLLAPSED_ENTROPY} of the uniform's "
        f"(largest {max(entropy):.3f}), so each query looks at one token and the loss will stall near the bigram "
        "level; lower the peak learning rate (or lengthen the warm-up, or set qk_norm='per_head' and bracket its "
        "rate anew); docs/stability.md in hires-hf explains"
    )


@torch.no_grad()
def projection_spectra(model: nn.Module, top: int = 3) -> dict[str, list[float]]:
    """Largest singular values of every read / write projection and of the read-out (empty for a vanilla model)."""
    blocks = _blocks(model)
    if blocks is None:
        return {}
    spectra: dict[str, list[float]] = {}
    for index, block in enumerate(blocks):
        spectra[f"read.{index}"] = _top_singular(block.read_proj.weight, top)
        spectra[f"write.{index}"] = _top_singular(block.write_proj.weight, top)
    spectra["read_out"] = _top_singular(getattr(model, "model", model).read_out.weight, top)
    return spectra


def _top_singular(weight: torch.Tensor, top: int) -> list[float]:
    return torch.linalg.svdvals(weight.detach().float())[:top].tolist()


def group_grad_norms(named_parameters: Iterable[tuple[str, nn.Parameter]]) -> dict[str, float]:
    """L2 norm of the gradient of each parameter group (call after backward, before the optimizer step)."""
    squares: dict[str, float] = {}
    for name, param in named_parameters:
        if param.grad is not None:
            group = param_group(name)
            squares[group] = squares.get(group, 0.0) + param.grad.detach().float().pow(2).sum().item()
    return {group: math.sqrt(value) for group, value in squares.items()}


def snapshot(named_parameters: Iterable[tuple[str, nn.Parameter]]) -> dict[str, torch.Tensor]:
    """A detached copy of every trainable parameter, to measure the next update against."""
    return {name: param.detach().clone() for name, param in named_parameters if param.requires_grad}


def group_update_ratios(
    before: dict[str, torch.Tensor], named_parameters: Iterable[tuple[str, nn.Parameter]]
) -> dict[str, float]:
    """||W_after - W_before|| / ||W_before|| per parameter group: how fast the optimizer moves each group."""
    update: dict[str, float] = {}
    weight: dict[str, float] = {}
    for name, param in named_parameters:
        if name not in before:
            continue
        group = param_group(name)
        old = before[name].float()
        update[group] = update.get(group, 0.0) + (param.detach().float() - old).pow(2).sum().item()
        weight[group] = weight.get(group, 0.0) + old.pow(2).sum().item()
    return {group: math.sqrt(update[group] / max(weight[group], 1e-30)) for group in update}


__all__ = [
    "COLLAPSED_ENTROPY",
    "PARAM_GROUPS",
    "attention_collapsed",
    "attention_entropy",
    "attention_weights",
    "collapse_advice",
    "group_grad_norms",
    "group_update_ratios",
    "param_group",
    "projection_spectra",
    "shared_fraction",
    "snapshot",
    "stream_probe",
]
