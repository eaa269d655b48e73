"""HiRes (Hierarchical Residuals) decoder models for transformers.

Where HiRes departs from Llama / OLMoE (everything else is the vanilla layer, unchanged):

- the token embedding is `residual_size` (D) wide, not `hidden_size` (d), and multiplied by
  `embedding_multiplier` so that tokens enter the wide stream at the scale the outer norms hold it at;
- the ordinary d-wide PreNorm layers (`model.layers.{l}`, Llama's names) run in groups of `layers_per_block` (k),
  one `HiResBlock` (`model.blocks.{b}`) a group: the block holds only its own read / write / norms and the range
  of layers it runs, so that every module name holds at most one index (vLLM keys a layer's KV cache by it);
- each block reads its input from the wide stream (`read_proj`, D -> d), writes its output back
  (`write_proj`, d -> D, times `write_multiplier`) through an RMSNorm (`write_norm`) and closes with a PostNorm
  over D (`outer_norm`): r <- Norm(skip_scale * r + write_multiplier * Write(Norm(h)));
- after the last block `read_out` (D -> d) brings the stream back to d for the final norm and the LM head.

Attention, RoPE, the KV cache (d-wide, one entry per layer) and MoE routing are exactly those of the vanilla
layer, so a Llama / OLMoE checkpoint converts into an equivalent HiRes model: with
`residual_size == hidden_size`, identity read / write / read-out, `write_mode="delta"` and `outer_norm=False`,
each block computes r <- r + (h_k - h_0) = h_k, the vanilla stack exactly.

This file imports only transformers and its sibling config: it ships unchanged as Hub remote code, and runs on
every transformers from 5.16.1 (the oldest vLLM 0.32 accepts) to the newest.
"""

import inspect
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import wraps

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.integrations import use_experts_implementation
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GenericForSequenceClassification, GradientCheckpointingLayer
from transformers.modeling_outputs import MoeCausalLMOutputWithPast, MoeModelOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_hires import HiResConfig

# transformers 5.24 renamed the KV cache `past_key_values` -> `cache`: the argument of `create_causal_mask` and of
# every forward, and the field of the output classes. 5.16-5.23 (what vLLM 0.32 installs) know only the old name.
# Read once here, so that the same file runs on both sides of the rename.
_MASK_CACHE = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
_OUTPUT_CACHE = "cache" if "cache" in {f.name for f in fields(MoeModelOutputWithPast)} else "past_key_values"

if _OUTPUT_CACHE == "cache":
    accepts_past_key_values = deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
else:

    def accepts_past_key_values(forward: Callable) -> Callable:
        """Before 5.24, transformers (`generate` included) passes the cache as `past_key_values`: take it as `cache`."""

        @wraps(forward)
        def wrapped(*args, **kwargs):
            if "past_key_values" in kwargs:
                kwargs["cache"] = kwargs.pop("past_key_values")
            return forward(*args, **kwargs)

        return wrapped


class HiResRMSNorm(nn.Module):
    """RMSNorm computed in float32 (as Llama's), used inside layers (width d) and on the wide stream (width D)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(input_dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class HiResRotaryEmbedding(nn.Module):
    """Rotary position embedding over `head_dim`; any rope type transformers knows (`rope_parameters`)."""

    inv_freq: torch.Tensor

    def __init__(self, config: HiResConfig) -> None:
        super().__init__()
        self.config = config
        self.max_seq_len_cached = config.max_position_embeddings
        self.original_max_seq_len = config.max_position_embeddings
        self.rope_type = config.rope_parameters["rope_type"]
        rope_init_fn = self.compute_default_rope_parameters
        if self.rope_type != "default":
            rope_init_fn = ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = rope_init_fn(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    @staticmethod
    def compute_default_rope_parameters(config: HiResConfig, **kwargs) -> tuple[torch.Tensor, float]:
        """Plain RoPE: frequencies theta^(-2i/head_dim), no attention scaling."""
        base = config.rope_parameters["rope_theta"]
        dim = config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv_freq, 1.0

    @torch.no_grad()
    @dynamic_rope_update
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device)  # (B, T, head_dim / 2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (B, T, head_dim)
        cos = angles.cos() * self.attention_scaling
        sin = angles.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k, both (B, heads, T, head_dim), by the angles of their positions."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, kv_heads, T, head_dim) -> (B, kv_heads * n_rep, T, head_dim): share each kv head with its query group."""
    if n_rep == 1:
        return states
    batch, kv_heads, seq_len, head_dim = states.shape
    states = states[:, :, None].expand(batch, kv_heads, n_rep, seq_len, head_dim)
    return states.reshape(batch, kv_heads * n_rep, seq_len, head_dim)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference attention in plain matmuls; the other backends come from ALL_ATTENTION_FUNCTIONS."""
    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, T_q, T_kv)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = F.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()  # (B, T_q, H, head_dim)
    return output, probs


class HiResAttention(nn.Module):
    """Multi-head (GQA) attention of a d-wide layer, with the q/k-norm and bias options of Llama, Qwen2/3 and OLMoE."""

    def __init__(self, config: HiResConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx  # global index over all layers: one KV-cache entry per layer
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True

        q_width = config.num_attention_heads * self.head_dim
        kv_width = config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_width, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_width, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_width, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_width, config.hidden_size, bias=config.attention_output_bias)
        if config.qk_norm == "full":  # OLMoE: one norm over all heads
            self.q_norm = HiResRMSNorm(q_width, eps=config.rms_norm_eps)
            self.k_norm = HiResRMSNorm(kv_width, eps=config.rms_norm_eps)
        elif config.qk_norm == "per_head":  # Qwen3: one norm per head, shared across heads
            self.q_norm = HiResRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = HiResRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    @accepts_past_key_values
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        head_shape = (*input_shape, -1, self.head_dim)
        query, key, value = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        if self.config.qk_norm == "full":
            query, key = self.q_norm(query), self.k_norm(key)
        if self.config.clip_qkv is not None:
            clip = self.config.clip_qkv
            query, key, value = query.clamp(-clip, clip), key.clamp(-clip, clip), value.clamp(-clip, clip)
        query, key, value = query.view(head_shape), key.view(head_shape), value.view(head_shape)  # (B, T, h, hd)
        if self.config.qk_norm == "per_head":
            query, key = self.q_norm(query), self.k_norm(key)
        query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (B, h, T, hd)

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights


class HiResMLP(nn.Module):
    """Dense SwiGLU feed-forward of width `intermediate_size`."""

    def __init__(self, config: HiResConfig) -> None:
        super().__init__()
        d, width = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, width, bias=config.mlp_bias)
        self.up_proj = nn.Linear(d, width, bias=config.mlp_bias)
        self.down_proj = nn.Linear(width, d, bias=config.mlp_bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class HiResTopKRouter(nn.Module):
    """OLMoE's router: softmax over all experts, keep the top k (optionally renormalised)."""

    def __init__(self, config: HiResConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.hidden_dim = config.hidden_size
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)  # (tokens, d)
        router_logits = F.linear(hidden_states, self.weight)  # (tokens, E)
        probs = F.softmax(router_logits, dim=-1, dtype=torch.float)
        top_weights, top_index = torch.topk(probs, self.top_k, dim=-1)  # (tokens, K)
        if self.norm_topk_prob:
            top_weights = top_weights / top_weights.sum(dim=-1, keepdim=True)
        return router_logits, top_weights.to(router_logits.dtype), top_index


@use_experts_implementation
class HiResExperts(nn.Module):
    """All experts' SwiGLU weights as 3D tensors; transformers swaps `forward` for the requested kernel
    (`config._experts_implementation`: eager, batched_mm, grouped_mm, ...)."""

    def __init__(self, config: HiResConfig) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.hidden_dim = config.hidden_size
        self.intermediate_dim = config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * self.intermediate_dim, self.hidden_dim))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, self.hidden_dim, self.intermediate_dim))
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """Eager reference: loop over the experts that received tokens."""
        output = torch.zeros_like(hidden_states)  # (tokens, d)
        for expert in top_k_index.unique().tolist():
            token_idx, slot = torch.where(top_k_index == expert)
            gate, up = F.linear(hidden_states[token_idx], self.gate_up_proj[expert]).chunk(2, dim=-1)
            expert_out = F.linear(self.act_fn(gate) * up, self.down_proj[expert])
            expert_out = expert_out * top_k_weights[token_idx, slot, None]
            output.index_add_(0, token_idx, expert_out.to(output.dtype))
        return output


class HiResSparseMoeBlock(nn.Module):
    """Router + experts, in place of the dense MLP (no shared expert, as OLMoE)."""

    def __init__(self, config: HiResConfig) -> None:
        super().__init__()
        self.gate = HiResTopKRouter(config)
        self.experts = HiResExperts(config)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, seq_len, width = hidden_states.shape
        flat = hidden_states.view(-1, width)  # (B * T, d)
        _, top_k_weights, top_k_index = self.gate(flat)
        return self.experts(flat, top_k_index, top_k_weights).view(batch, seq_len, width)


class HiResDecoderLayer(GradientCheckpointingLayer):
    """The vanilla d-wide PreNorm layer: h = h + Attn(Norm(h)); h = h + FFN(Norm(h))."""

    def __init__(self, config: HiResConfig, layer_idx: int) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size
        self.self_attn = HiResAttention(config, layer_idx)
        self.mlp = HiResSparseMoeBlock(config) if config.is_moe else HiResMLP(config)
        self.input_layernorm = HiResRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = HiResRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    @accepts_past_key_values
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attn_out, _ = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = hidden_states + attn_out
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class HiResProjection(nn.Linear):
    """A bias-free map between the layer width d and the stream width D (read, write, read-out).

    Its own class so that `_init_weights` can find it: with `projection_init="identity"` it starts as the
    rectangular identity ([I_d | 0] to read, [I_d ; 0] to write): the first d coordinates of the wide stream
    are then the vanilla residual stream. `output_multiplier` is the constant the caller multiplies its output
    by (the write's `write_multiplier`): the weights start larger by its inverse, so that the map, multiplier
    included, starts as any other. The multiplication itself happens in the block, outside this module, so that
    tools which swap every `nn.Linear` for their own (vLLM) keep it.
    """

    def __init__(self, in_features: int, out_features: int, output_multiplier: float = 1.0) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.output_multiplier = output_multiplier


class HiResScaledEmbedding(nn.Embedding):
    """The V x D token embedding, times `embedding_multiplier` in the forward pass.

    The outer PostNorms hold the wide stream at RMS ~1; a vanilla-scale embedding (RMS = initializer_range)
    would enter it ~50x smaller than what block 0 writes next to it, and the first outer norm would divide the
    token identity away (HiRes then stalls at the unigram loss). The weights keep the vanilla init, so Adam moves
    them at the vanilla relative speed; the multiplier lives here, not in the model's forward, so that
    `get_input_embeddings()(ids)` is exactly what the blocks see (`inputs_embeds`).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, multiplier: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.embed_scale = multiplier  # the name transformers' scaled embeddings (Gemma 3) use for the same thing

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeds = super().forward(input_ids)
        return embeds if self.embed_scale == 1.0 else embeds * self.embed_scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, embed_scale={self.embed_scale:g}"


class HiResBlock(nn.Module):
    """Runs its k layers (`layer_range`, indices into `HiResModel.layers`) between a read from and a write into the
    D-wide stream, closed by a PostNorm over D.

    The layers themselves live in the model's flat `layers` list, as Llama's do: the block holds only what is its
    own (read, write, their norms), so that no module name holds two indices.
    With the outer norm on, the write reads its input through `write_norm`: every projection then reads a
    normalised vector, as every matrix of a PreNorm layer does, instead of the raw inner stream whose scale
    drifts during training."""

    def __init__(self, config: HiResConfig, block_idx: int) -> None:
        super().__init__()
        d, wide, k = config.hidden_size, config.residual_size, config.layers_per_block
        self.layer_range = range(block_idx * k, (block_idx + 1) * k)
        self.write_delta = config.write_mode == "delta"
        self.read_proj = HiResProjection(wide, d)
        self.write_norm = HiResRMSNorm(d, eps=config.rms_norm_eps) if config.write_norm else None
        self.write_multiplier = config.write_multiplier
        self.write_proj = HiResProjection(d, wide, output_multiplier=config.write_multiplier)
        self.outer_norm = HiResRMSNorm(wide, eps=config.rms_norm_eps) if config.outer_norm else None
        self.skip_scale = config.skip_scale

    def forward(self, residual: torch.Tensor, layers: nn.ModuleList, **layer_kwargs) -> torch.Tensor:
        """(B, T, D) -> (B, T, D), running `layers[i]` for i in `layer_range` on the d-wide inner stream."""
        h0 = self.read_proj(residual)  # (B, T, d)
        hidden = h0
        for index in self.layer_range:
            hidden = layers[index](hidden, **layer_kwargs)  # positional: gradient checkpointing needs it so
        hidden = hidden.to(h0.device)  # a device map may have put the last layer elsewhere
        written = hidden - h0 if self.write_delta else hidden
        if self.write_norm is not None:  # the inner stream's scale drifts; the write must not inherit it
            written = self.write_norm(written)
        update = self.write_proj(written)  # (B, T, D)
        if self.write_multiplier != 1.0:  # the write's Adam step falls as 1 / width (muP)
            update = update * self.write_multiplier
        residual = (residual if self.skip_scale == 1.0 else residual * self.skip_scale) + update
        return residual if self.outer_norm is None else self.outer_norm(residual)


class HiResPreTrainedModel(PreTrainedModel):
    config: HiResConfig
    config_class = HiResConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    # Units a device map keeps whole (a block's read, write and norms; a layer): the block moves its last layer's
    # output to its own device itself.
    _no_split_modules = ["HiResDecoderLayer", "HiResBlock"]
    _skip_keys_device_placement = [_OUTPUT_CACHE]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # fullgraph holds for dense and for MoE with the grouped_mm / batched_mm experts (not the eager reference loop)
    _can_compile_fullgraph = True
    _can_record_outputs = {
        "router_logits": OutputRecorder(HiResTopKRouter, index=0),
        "hidden_states": HiResDecoderLayer,
        "attentions": HiResAttention,
    }

    @classmethod
    def prepare_distribute_model(cls, distributed_config, device_map=None):
        """Refuse pipeline parallelism before any device mesh is built.

        transformers' pipeline runtime splits `base_model.layers` and passes `hidden_size`-wide activations between
        stages; HiRes interleaves those layers with its blocks, and what crosses a block boundary is the
        `residual_size`-wide stream.
        """
        pp_size = (
            distributed_config.get("pp_size")
            if isinstance(distributed_config, dict)
            else getattr(distributed_config, "pp_size", None)
        )
        if pp_size is not None and pp_size > 1:
            raise ValueError(
                f"HiRes does not support pipeline parallelism (pp_size={pp_size}); use tensor parallelism "
                "(tp_plan='auto'), FSDP2 (fsdp_size), HSDP (fsdp_size + dp_replicate_size) or, for MoE, expert "
                "parallelism (ep_size) instead."
            )
        return super().prepare_distribute_model(distributed_config, device_map=device_map)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' `from_pretrained`, refusing (in one line) a local folder saved with the nested layer names
        of hires-hf 0.1, which would otherwise load with every layer left at its random init."""
        legacy = _nested_layer_key(pretrained_model_name_or_path)
        if legacy is not None:
            raise ValueError(
                f"{pretrained_model_name_or_path} holds weights saved with HiRes's old nested layer names "
                f"({legacy}: layers inside blocks, hires-hf 0.1); layers now live at model.layers.{{l}}: rename them "
                f"with `python -m hires_hf.conversion.legacy {pretrained_model_name_or_path}` (pip install hires-hf)."
            )
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, HiResExperts):
            init.normal_(module.gate_up_proj, mean=0.0, std=std)
            init.normal_(module.down_proj, mean=0.0, std=std)
        elif isinstance(module, HiResTopKRouter):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, HiResProjection) and self.config.projection_init == "identity":
            weight = module.weight  # the map, multiplier included, is the rectangular identity
            eye = torch.eye(*weight.shape, dtype=weight.dtype, device=weight.device)
            init.copy_(weight, eye / module.output_multiplier)
        elif isinstance(module, HiResProjection) and self.config.projection_init == "fan_in":
            # every projection reads a normalised vector: std 1/sqrt(fan_in) maps it to RMS ~1, the stream's scale
            std = module.in_features**-0.5
            init.normal_(module.weight, mean=0.0, std=std / module.output_multiplier)
        elif isinstance(module, HiResProjection) and module.output_multiplier != 1.0:
            init.normal_(module.weight, mean=0.0, std=std / module.output_multiplier)  # the map starts at std


NESTED_LAYER_KEY = re.compile(r"(^|\.)blocks\.\d+\.layers\.\d+\.")  # hires-hf 0.1: model.blocks.{b}.layers.{i}.


def _nested_layer_key(folder: str | os.PathLike) -> str | None:
    """The first weight name of a local model folder in hires-hf 0.1's nested layout, else None (read from the
    safetensors index or the single file's header: no tensor is loaded)."""
    if not os.path.isdir(folder):
        return None
    index = os.path.join(folder, "model.safetensors.index.json")
    single = os.path.join(folder, "model.safetensors")
    if os.path.isfile(index):
        with open(index) as handle:
            names = list(json.load(handle).get("weight_map", {}))
    elif os.path.isfile(single):
        with open(single, "rb") as handle:  # safetensors: 8-byte little-endian header length, then a JSON header
            names = list(json.loads(handle.read(int.from_bytes(handle.read(8), "little"))))
    else:
        return None
    return next((name for name in names if NESTED_LAYER_KEY.search(name)), None)


class HiResModel(HiResPreTrainedModel):
    """Embedding (V x D) -> blocks on the D-wide stream, block b running layers b*k .. b*k+k-1 -> read-out (D -> d)
    -> final RMSNorm over d."""

    def __init__(self, config: HiResConfig) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = HiResScaledEmbedding(
            config.vocab_size, config.residual_size, self.padding_idx, config.embedding_multiplier
        )
        self.layers = nn.ModuleList(HiResDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.blocks = nn.ModuleList(HiResBlock(config, b) for b in range(config.num_blocks))  # each runs k layers
        self.read_out = HiResProjection(config.residual_size, config.hidden_size)
        self.norm = HiResRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = HiResRotaryEmbedding(config)
        self.gradient_checkpointing = False
        self.post_init()

    @accepts_past_key_values
    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MoeModelOutputWithPast:
        r"""`inputs_embeds`, when given, are D-wide (what `embed_tokens` returns, multiplier included)."""
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # (B, T, D)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            past_seen = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen
            position_ids = position_ids.unsqueeze(0)

        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{_MASK_CACHE: cache},
        )
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids=position_ids)

        residual = inputs_embeds
        for block in self.blocks:
            residual = block(
                residual,
                self.layers,
                attention_mask=causal_mask,
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                cache=cache,
                use_cache=use_cache,
                **kwargs,
            )
        hidden_states = self.norm(self.read_out(residual))  # (B, T, d)
        return MoeModelOutputWithPast(last_hidden_state=hidden_states, **{_OUTPUT_CACHE: cache})


def load_balancing_loss(
    router_logits: tuple[torch.Tensor, ...], top_k: int, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Switch-Transformer balance loss over all MoE layers, as OLMoE computes it.

    E * sum_e f_e * P_e, where f_e is the share of (token, slot) assignments to expert e times K and P_e the
    mean router probability of e; padding tokens (attention_mask == 0) are left out. Equals K (num_experts_per_tok)
    at perfect balance.
    """
    logits = torch.cat([layer.float() for layer in router_logits], dim=0)  # (layers * tokens, E)
    num_experts = logits.shape[-1]
    probs = F.softmax(logits, dim=-1)
    chosen = F.one_hot(torch.topk(probs, top_k, dim=-1).indices, num_experts).sum(dim=1).float()  # (N, E)
    if attention_mask is None:
        weight = torch.ones(logits.shape[0], 1, device=logits.device)
    else:
        weight = attention_mask.reshape(-1, 1).to(logits.device, torch.float).repeat(len(router_logits), 1)
    total = weight.sum()
    tokens_per_expert = (chosen * weight).sum(dim=0) / total
    prob_per_expert = (probs * weight).sum(dim=0) / total
    return num_experts * torch.sum(tokens_per_expert * prob_per_expert)


def router_z_loss(router_logits: tuple[torch.Tensor, ...], attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """ST-MoE's z-loss: mean over tokens (and layers) of logsumexp(router logits)^2; keeps logits small."""
    logits = torch.cat([layer.float() for layer in router_logits], dim=0)  # (layers * tokens, E)
    z = torch.logsumexp(logits, dim=-1).pow(2)
    if attention_mask is None:
        return z.mean()
    weight = attention_mask.reshape(-1).to(logits.device, torch.float).repeat(len(router_logits))
    return (z * weight).sum() / weight.sum()


@dataclass
class HiResCausalLMOutputWithPast(MoeCausalLMOutputWithPast):
    r"""MoE outputs plus the router z-loss (`aux_loss` is the load-balancing loss), each before its coefficient."""

    z_loss: torch.FloatTensor | None = None


class HiResForCausalLM(HiResPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _fsdp_plan = {"lm_head": "keep_full_weight"}

    def __init__(self, config: HiResConfig) -> None:
        super().__init__(config)
        self.model = HiResModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)  # V x d, as vanilla
        self.post_init()

    @accepts_past_key_values
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_router_logits: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> HiResCausalLMOutputWithPast:
        r"""With `labels`, the loss is the LM loss plus, for MoE with router logits on,
        `router_aux_loss_coef * aux_loss + router_z_loss_coef * z_loss`."""
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        output_router_logits = output_router_logits and self.config.is_moe
        outputs: MoeModelOutputWithPast = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_router_logits=output_router_logits,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])

        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)

        aux_loss = z_loss = None
        if output_router_logits and outputs.router_logits:
            aux_loss = load_balancing_loss(outputs.router_logits, self.config.num_experts_per_tok, attention_mask)
            z_loss = router_z_loss(outputs.router_logits, attention_mask)
            if loss is not None:
                router_loss = self.config.router_aux_loss_coef * aux_loss + self.config.router_z_loss_coef * z_loss
                loss = loss + router_loss.to(loss.device)

        return HiResCausalLMOutputWithPast(
            loss=loss,
            aux_loss=aux_loss,
            z_loss=z_loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            router_logits=outputs.router_logits,
            **{_OUTPUT_CACHE: getattr(outputs, _OUTPUT_CACHE)},
        )


class HiResForSequenceClassification(GenericForSequenceClassification, HiResPreTrainedModel):
    """Last-token classification head over d (transformers' generic head, built on HiResModel directly so
    that it needs no Auto registration when loaded as remote code)."""

    def __init__(self, config: HiResConfig) -> None:
        HiResPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = HiResModel(config)
        self.score = nn.Linear(config.hidden_size, self.num_labels, bias=False)
        self.post_init()


__all__ = [
    "HiResCausalLMOutputWithPast",
    "HiResForCausalLM",
    "HiResForSequenceClassification",
    "HiResModel",
    "HiResPreTrainedModel",
    "load_balancing_loss",
    "router_z_loss",
]
