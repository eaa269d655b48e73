"""Residual-widening peers of HiRes, isolated around identical Llama layers.

What is compared is the *mechanism*, not two whole foreign models. So each peer here is a
Llama decoder (transformers' own `LlamaDecoderLayer` attention / MLP / norms, rotary embedding, mask and
KV cache) whose residual wiring is replaced by the peer's module, taken unchanged from transformers:

- mHC with `n` streams: `DeepseekV4HyperConnection` around every attention and every MLP (DeepSeek-V4's
  wiring: collapse with `pre`, expand the sublayer output with `post`, mix the streams with the Sinkhorn
  `comb`), `DeepseekV4HyperHead` collapses the streams before the final norm. The residual is (B, T, n, d).
- Block Attention Residuals: `Inkling2BlockAttentionResidual` before every attention and every MLP
  (Inkling2's wiring: a learned query attends over the summaries of the finished blocks plus the running
  partial sum; a block boundary every `block_size` layers), and once more before the final norm.

What is left out of the donor models on purpose (it is not the residual mechanism): DeepSeek-V4's compressed
attention and hash routing, Inkling2's short convolutions, sliding / 3-query attention inputs and MoE. Only a
dense Llama layer is wired, so these peers have no MoE rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection, DeepseekV4HyperHead
from transformers.models.inkling2.modeling_inkling2 import Inkling2BlockAttentionResidual
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding


@dataclass
class HyperConnectionSettings:
    """The fields `DeepseekV4HyperConnection` / `DeepseekV4HyperHead` read from their config."""

    hidden_size: int
    rms_norm_eps: float
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20  # DeepSeek-V4's default
    hc_eps: float = 1e-6


class ResidualPeerForCausalLM(nn.Module):
    """Embedding -> Llama layers under some residual wiring -> final norm -> head; subclasses give the wiring.

    Called like a transformers causal LM (`input_ids`, `cache`, `use_cache`, `labels`), so that the benchmark
    drives every row the same way.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        if config._attn_implementation is None:  # a bare config (no from_pretrained) has not picked one yet
            config._attn_implementation = "sdpa"
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def init_weights(self) -> None:
        """Llama's init for the shared parts; each mechanism's own init comes from its donor model."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, LlamaRMSNorm):
                nn.init.ones_(module.weight)

    def wire(self, embeds: torch.Tensor, **layer_kwargs) -> torch.Tensor:
        """(B, T, d) embeddings -> (B, T, d) state before the final norm."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.LongTensor,
        cache: Cache | None = None,
        use_cache: bool = False,
        labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        embeds = self.embed_tokens(input_ids)  # (B, T, d)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past_seen = cache.get_seq_length() if cache is not None else 0
        position_ids = (torch.arange(embeds.shape[1], device=embeds.device) + past_seen).unsqueeze(0)
        mask = create_causal_mask(
            config=self.config, inputs_embeds=embeds, attention_mask=None, cache=cache, position_ids=position_ids
        )
        hidden = self.wire(
            embeds,
            attention_mask=mask,
            position_embeddings=self.rotary_emb(embeds, position_ids=position_ids),
            position_ids=position_ids,
            cache=cache,
        )
        logits = self.lm_head(self.norm(hidden))
        loss = None
        if labels is not None:  # next-token loss, as transformers' causal LMs compute it
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)


class MHCForCausalLM(ResidualPeerForCausalLM):
    """Llama layers under DeepSeek-V4's manifold-constrained hyper-connections (`hc_mult` residual streams)."""

    def __init__(self, config: LlamaConfig, streams: int = 4) -> None:
        super().__init__(config)
        settings = HyperConnectionSettings(config.hidden_size, config.rms_norm_eps, hc_mult=streams)
        self.streams = streams
        self.attn_hc = nn.ModuleList(DeepseekV4HyperConnection(settings) for _ in self.layers)
        self.ffn_hc = nn.ModuleList(DeepseekV4HyperConnection(settings) for _ in self.layers)
        self.hc_head = DeepseekV4HyperHead(settings)
        self.init_weights()

    def init_weights(self) -> None:
        """DeepSeek-V4's init of the hyper-connection parameters."""
        super().init_weights()
        std = self.config.initializer_range
        for hc in [*self.attn_hc, *self.ffn_hc]:
            nn.init.normal_(hc.fn, mean=0.0, std=std)
            nn.init.zeros_(hc.base)
            nn.init.ones_(hc.scale)
        nn.init.normal_(self.hc_head.hc_fn, mean=0.0, std=std)
        nn.init.zeros_(self.hc_head.hc_base)
        nn.init.ones_(self.hc_head.hc_scale)

    def wire(self, embeds: torch.Tensor, **layer_kwargs) -> torch.Tensor:
        streams = embeds.unsqueeze(2).expand(-1, -1, self.streams, -1).contiguous()  # (B, T, n, d)
        for layer, attn_hc, ffn_hc in zip(self.layers, self.attn_hc, self.ffn_hc):
            post, comb, collapsed = attn_hc(streams)  # collapsed: (B, T, d)
            attn_out, _ = layer.self_attn(layer.input_layernorm(collapsed), **layer_kwargs)
            streams = _expand_and_mix(post, comb, attn_out, streams)
            post, comb, collapsed = ffn_hc(streams)
            streams = _expand_and_mix(post, comb, layer.mlp(layer.post_attention_layernorm(collapsed)), streams)
        return self.hc_head(streams)


def _expand_and_mix(
    post: torch.Tensor, comb: torch.Tensor, output: torch.Tensor, streams: torch.Tensor
) -> torch.Tensor:
    """DeepSeek-V4's update: streams <- post (x) output + comb^T @ streams.

    post (B, T, n), comb (B, T, n, n), output (B, T, d), streams (B, T, n, d) -> (B, T, n, d).
    """
    dtype = streams.dtype
    expanded = post.to(dtype).unsqueeze(-1) * output.unsqueeze(-2)  # (B, T, n, d)
    return expanded + torch.matmul(comb.to(dtype).transpose(-1, -2), streams)


class BlockAttnResForCausalLM(ResidualPeerForCausalLM):
    """Llama layers under Inkling2's Block Attention Residuals, a block boundary every `block_size` layers."""

    def __init__(self, config: LlamaConfig, block_size: int = 4) -> None:
        super().__init__(config)
        self.block_size = block_size
        # Inkling2's first layer has no attention input: there is nothing to attend over yet.
        self.attention_input = nn.ModuleList(
            Inkling2BlockAttentionResidual(config) if i > 0 else nn.Identity() for i in range(len(self.layers))
        )
        self.mlp_input = nn.ModuleList(Inkling2BlockAttentionResidual(config) for _ in self.layers)
        self.final_input = Inkling2BlockAttentionResidual(config)
        self.init_weights()

    def init_weights(self) -> None:
        """Inkling2 starts every query at zero: a uniform average over the block summaries."""
        super().init_weights()
        for module in self.modules():
            if isinstance(module, Inkling2BlockAttentionResidual):
                nn.init.zeros_(module.query)

    def wire(self, embeds: torch.Tensor, **layer_kwargs) -> torch.Tensor:
        hidden = embeds  # the running partial sum of the current block, (B, T, d)
        summaries = embeds.new_zeros(*embeds.shape[:-1], 0, embeds.shape[-1])  # (B, T, blocks so far, d)
        for i, layer in enumerate(self.layers):
            block_input = hidden
            attn_in = hidden if i == 0 else self.attention_input[i](summaries, hidden)[0]
            attn_out, _ = layer.self_attn(layer.input_layernorm(attn_in), **layer_kwargs)
            if i % self.block_size == 0:  # the block before closes: its sum becomes a summary
                summaries = torch.cat([summaries, block_input.unsqueeze(-2)], dim=-2)
                partial = attn_out
            else:
                partial = block_input + attn_out
            mlp_in = self.mlp_input[i](summaries, partial)[0]
            hidden = partial + layer.mlp(layer.post_attention_layernorm(mlp_in))
        return self.final_input(summaries, hidden)[0]


# ---------------------------------------------------------------------------------------------- accounting
def mhc_extra_flops_per_token(config: LlamaConfig, streams: int = 4) -> float:
    """Matmul FLOPs mHC adds per token (docs/architecture.md's convention: matmuls only, 2 FLOPs per MAC).

    Per hyper-connection: the weight projection n*d -> (2+n)*n and the n x n stream mix over d;
    two per layer, plus the head's n*d -> n projection.
    """
    d, n = config.hidden_size, streams
    per_connection = n * d * (2 + n) * n + n * n * d
    return 2.0 * (2 * config.num_hidden_layers * per_connection + n * d * n)


def attnres_extra_flops_per_token(config: LlamaConfig, block_size: int = 4) -> float:
    """Matmul FLOPs Block AttnRes adds per token: scores and weighted sums over (summaries + partial) d-vectors."""
    d, keys = config.hidden_size, 0
    summaries = 0
    for i in range(config.num_hidden_layers):
        if i > 0:
            keys += summaries + 1  # attention input
        if i % block_size == 0:
            summaries += 1
        keys += summaries + 1  # MLP input
    keys += summaries + 1  # final input
    return 2.0 * 2 * d * keys  # QK^T and PV, each d MACs per key


__all__ = [
    "BlockAttnResForCausalLM",
    "MHCForCausalLM",
    "ResidualPeerForCausalLM",
    "attnres_extra_flops_per_token",
    "mhc_extra_flops_per_token",
]
