"""HiRes configuration: the architecture's public contract.

Field names follow transformers' Llama / OLMoE configs wherever the meaning is the same, so that tools and
people recognise them. Two layer options let one config hold Llama, Qwen2, Qwen3 and OLMoE layers exactly:
`attention_output_bias` (a bias on o_proj, separate from `attention_bias` on q/k/v) and `qk_norm` (None,
"per_head" as Qwen3, "full" as OLMoE). HiRes itself adds nine fields:

- `residual_size` (D, default 2 * hidden_size): width of the residual stream *between* blocks; `hidden_size` (d)
  stays every layer's compute width.
- `layers_per_block` (k): consecutive d-wide PreNorm layers grouped into one block; it must divide
  `num_hidden_layers`.
- `write_mode`: what a block writes back into the wide stream, its output ("output") or what it added ("delta").
- `outer_norm`: the PostNorm over D after each block's write (off only for ablations and exact upcycling).
- `projection_init`: how read / write / read-out projections start: "identity" (the default: the rectangular
  identity, so that the first d coordinates of the wide stream start as a plain residual stream; the best init of
  the design sweep, docs/research.md), "normal" (std `initializer_range`, as every other matrix) or "fan_in"
  (std 1 / sqrt(fan_in), which maps a normalised input to RMS ~1).
- `write_norm`: an RMSNorm (with its own gain) on what a block writes, before the write projection. With the
  outer norm on, every projection then reads a normalised vector: the read and the read-out read the stream the
  outer norms hold at RMS 1, the layers read their PreNorms, and the write reads this norm instead of the raw
  inner residual stream, whose scale drifts freely during training. Default: on exactly when the outer norm is.
- `write_multiplier`: a constant the write projection's output is multiplied by, with the stored weights
  initialised larger by its inverse (so the initial function is unchanged). Under Adam a step moves every weight
  by ~lr, so the write's output moves by ~lr * d per step: in a stream the outer norms pin at RMS 1 that is a
  width-dependent jump. The default `WRITE_BASE_WIDTH / hidden_size` (with the outer norm; 1.0 without) makes
  the write's effective learning rate fall as 1/d, as muP prescribes for Adam, so that a learning rate that is
  safe at one width stays safe at another.
- `embedding_multiplier`: the constant the wide token embedding is multiplied by in the forward pass. By
  default `1 / initializer_range` when the outer norm is on, so that tokens enter the wide stream at the scale
  the outer PostNorms hold it at (RMS 1), while the stored weights keep the vanilla init and so Adam's usual
  relative update speed; 1.0 without the outer norm (an additive stream, as vanilla). With a vanilla-scale
  embedding (1.0) and the outer norm on, HiRes collapses onto the unigram plateau at ordinary learning rates.
- `skip_scale`: the weight of the skip path in the outer residual, r <- Norm(skip_scale * r + write); 1.0 is the
  plain residual.

`num_experts=0` gives dense SwiGLU layers; `num_experts>0` gives OLMoE-style sparse MoE layers.

Defaults that depend on other fields (`DERIVED_DEFAULTS`: head_dim, num_key_value_heads, residual_size,
write_norm, write_multiplier, embedding_multiplier, router_aux_loss_coef, moe_intermediate_size) are None in the
signature and in config.json: a field left to None is derived from the final values of the fields it depends on,
again whenever one of them is assigned, and again when a dict or config.json is read back, so that changing
`outer_norm` or `hidden_size` changes them too. A value given explicitly (a number in config.json) always wins.

This file imports nothing of ours so that it ships unchanged as Hub remote code.
"""

from collections.abc import Callable
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers.configuration_utils import PreTrainedConfig
from transformers.modeling_rope_utils import RopeParameters

WRITE_MODES = ("output", "delta")
PROJECTION_INITS = ("normal", "identity", "fan_in")
QK_NORMS = (None, "per_head", "full")
WRITE_BASE_WIDTH = 64  # the width at which the write's multiplier is 1 (muP's base width; the sweep's best)

# The fields whose default, None, means "derived from the other fields", and how. A field left to None is
# computed from the final values of the fields it depends on: at construction, and again whenever a field is
# assigned. `to_dict()`, and so config.json, writes it as None, so that a config rebuilt from a dict with a field
# changed, or a hand-edited config.json, derives it afresh. A value given explicitly is kept everywhere.
DERIVED_DEFAULTS: dict[str, Callable[[Any], Any]] = {
    # d / heads; left None when the heads do not divide d (validate_attention then says why)
    "head_dim": lambda c: (
        c.hidden_size // c.num_attention_heads
        if c.num_attention_heads > 0 and c.hidden_size % c.num_attention_heads == 0
        else None
    ),
    "num_key_value_heads": lambda c: c.num_attention_heads,  # multi-head attention
    "residual_size": lambda c: 2 * c.hidden_size,  # D = 2d
    # the write reads a normalised vector wherever the stream it writes into is normalised
    "write_norm": lambda c: c.outer_norm,
    # the write's effective Adam step falls as 1 / width (muP), on the normalised stream only
    "write_multiplier": lambda c: WRITE_BASE_WIDTH / c.hidden_size if c.outer_norm and c.hidden_size > 0 else 1.0,
    # tokens enter the normalised stream at the RMS the outer norms keep it at
    "embedding_multiplier": lambda c: 1.0 / c.initializer_range if c.outer_norm and c.initializer_range > 0 else 1.0,
    # OLMoE's load-balancing weight; 0 when dense (tools such as TRL read non-zero as "MoE")
    "router_aux_loss_coef": lambda c: 0.01 if c.num_experts else 0.0,
    "moe_intermediate_size": lambda c: c.intermediate_size if c.num_experts else None,
}

# Every saved folder names all its classes, whichever one saved it, so that the folder loads as remote code
# through any of these Auto classes (transformers only adds the saving class on its own).
HUB_AUTO_MAP = {
    "AutoConfig": "configuration_hires.HiResConfig",
    "AutoModel": "modeling_hires.HiResModel",
    "AutoModelForCausalLM": "modeling_hires.HiResForCausalLM",
    "AutoModelForSequenceClassification": "modeling_hires.HiResForSequenceClassification",
}


@strict
class HiResConfig(PreTrainedConfig):
    r"""Configuration of a HiRes decoder (dense or MoE).

    Example:
        >>> from hires_hf import HiResConfig
        >>> config = HiResConfig.from_preset("tiny")
        >>> config.num_blocks
        2
    """

    model_type = "hires"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]  # the output's cache field: 5.24+, before 5.24
    # `embedding_size` is what vLLM (and other tools) read for the embedding width: here it is D, not d.
    attribute_map = {"num_local_experts": "num_experts", "embedding_size": "residual_size"}

    # Module names are the real ones of modeling_hires.py: the decoder layers are Llama's `layers.{l}`, and
    # `blocks.{b}` holds only each block's read / write / norms. The tensor- and expert-parallel plans depend on
    # the variant (dense or MoE, which q/k norm): `base_model_tp_plan` and `base_model_ep_plan` are properties,
    # below, so that a plan never names a module the model lacks.
    # FSDP2 gathers one unit at a time: a decoder layer, or one block's own read / write / norms.
    base_model_fsdp_plan = {
        "embed_tokens": "free_full_weight",
        "layers.*": "free_full_weight",
        "blocks.*": "free_full_weight",
        "read_out": "keep_full_weight",
        "norm": "keep_full_weight",
    }
    # No pipeline plan: stages run in order, and HiRes interleaves its blocks with the layers they run (the
    # model refuses pp_size > 1 in `prepare_distribute_model`; vLLM refuses two ModuleLists itself).
    base_model_pp_plan = None

    # --- the usual decoder fields (Llama / OLMoE names) ---
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = False
    rope_parameters: RopeParameters | dict | None = None
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2: True)
    attention_output_bias: bool = False  # bias on o_proj (Llama with attention_bias=True: True)
    attention_dropout: float | int = 0.0
    mlp_bias: bool = False
    qk_norm: str | None = None  # None, "per_head" (Qwen3, over head_dim) or "full" (OLMoE, over all heads)
    clip_qkv: float | None = None  # OLMoE's optional clamp of q/k/v

    # --- mixture of experts (num_experts=0: dense) ---
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool = False
    router_aux_loss_coef: float | None = None  # None -> 0.01 with experts, 0.0 dense (no router to balance)
    router_z_loss_coef: float = 0.0
    output_router_logits: bool = False

    # --- HiRes ---
    residual_size: int | None = None  # D; None -> 2 * hidden_size
    layers_per_block: int = 4  # k
    write_mode: str = "output"
    outer_norm: bool = True
    projection_init: str = "identity"
    write_norm: bool | None = None  # None -> outer_norm: normalise what a block writes into a normalised stream
    write_multiplier: float | None = None  # None -> WRITE_BASE_WIDTH / hidden_size with the outer norm, else 1.0
    embedding_multiplier: float | None = None  # None -> 1 / initializer_range with the outer norm, else 1.0
    skip_scale: float = 1.0  # the outer residual's skip path: r <- Norm(skip_scale * r + write) (DeepNet's alpha)

    def __post_init__(self, **kwargs: Any) -> None:
        # The fields left to None are derived (DERIVED_DEFAULTS), now and whenever another field is assigned.
        self.__dict__["_derived_fields"] = frozenset(name for name in DERIVED_DEFAULTS if getattr(self, name) is None)
        self._derive()
        super().__post_init__(**kwargs)
        if getattr(self, "auto_map", None) is None:
            self.auto_map = dict(HUB_AUTO_MAP)

    def _derive(self) -> None:
        for name in self._derived_fields:
            super().__setattr__(name, DERIVED_DEFAULTS[name](self))  # not through our __setattr__: stays derived

    def __setattr__(self, name: str, value: Any) -> None:
        """Assigning a field re-derives the fields left to their default; assigning a derived field pins it (or,
        with None, hands it back to the derivation)."""
        super().__setattr__(name, value)
        derived = self.__dict__.get("_derived_fields")
        name = self.attribute_map.get(name, name)
        if derived is None or name not in self.__dataclass_fields__:
            return  # still being constructed, or not a field
        if name in DERIVED_DEFAULTS:
            self.__dict__["_derived_fields"] = derived | {name} if value is None else derived - {name}
        self._derive()

    def to_dict(self) -> dict[str, Any]:
        """transformers' dict, with every derived field as None: wherever the dict is read back (`from_dict`,
        config.json), those fields are derived again from the values that come with them."""
        output = super().to_dict()
        output.pop("_derived_fields", None)
        output.update(dict.fromkeys(getattr(self, "_derived_fields", ())))
        return output

    # ------------------------------------------------------------------ derived values
    @property
    def num_blocks(self) -> int:
        """B = L / k, derived so that it can never disagree with the two fields it comes from."""
        return self.num_hidden_layers // self.layers_per_block

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    # ------------------------------------------------------------------ parallel plans (docs/distributed.md)
    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism inside the d-wide layers, as Llama / Qwen3 / OLMoE shard theirs.

        The wide embedding is split on the vocabulary (each rank looks up its rows, one all-reduce of the D-wide
        sum). The read, write and read-out projections and every norm are replicated: sharding them would add a
        collective per projection for a few percent of the weights (docs/distributed.md gives the numbers).
        """
        layer = "layers.*"
        attention = [f"{layer}.self_attn.{name}" for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        if self.qk_norm == "full":
            # OLMoE: one norm over all heads needs q and k whole on every rank; gather them, split o_proj's input
            plan = dict.fromkeys(attention[:3], "colwise_gather_output") | {attention[3]: "rowwise_split_input"}
        else:
            plan = dict.fromkeys(attention[:3], "colwise") | {attention[3]: "rowwise"}
            if self.qk_norm == "per_head":  # Qwen3: each rank normalises its own heads; the gains' grads add up
                plan |= dict.fromkeys(
                    (f"{layer}.self_attn.q_norm", f"{layer}.self_attn.k_norm"), "replicated_with_grad_allreduce"
                )
        if self.num_experts > 0:
            plan |= {
                f"{layer}.mlp.experts.gate_up_proj": "packed_colwise",
                f"{layer}.mlp.experts.down_proj": "rowwise",
                f"{layer}.mlp.experts": "moe_tp_experts",
            }
        else:
            plan |= {f"{layer}.mlp.gate_proj": "colwise", f"{layer}.mlp.up_proj": "colwise"}
            plan |= {f"{layer}.mlp.down_proj": "rowwise"}
        return {"embed_tokens": "embedding_rowwise", **plan}

    @base_model_tp_plan.setter
    def base_model_tp_plan(self, plan: dict[str, str]) -> None:
        """transformers 5.16-5.23 re-assign the plan of a tied-embedding config with `embed_tokens` split by rows,
        which the derived plan already says: accepted when it changes nothing, refused otherwise."""
        if plan != self.base_model_tp_plan:
            raise AttributeError(
                "HiResConfig.base_model_tp_plan is derived from the config (dense or MoE, qk_norm); to shard "
                "differently pass tp_plan={...} to from_pretrained or DistributedConfig (docs/distributed.md)."
            )

    @property
    def base_model_ep_plan(self) -> dict[str, str]:
        """Expert parallelism: whole experts per rank, tokens dispatched to them (empty for a dense model, so that
        `ep_size > 1` on one is refused by transformers instead of silently ignored)."""
        if self.num_experts == 0:
            return {}
        experts = "layers.*.mlp.experts"
        return {
            f"{experts}.gate_up_proj": "grouped_gemm",
            f"{experts}.down_proj": "grouped_gemm",
            experts: "ep_dispatch_experts",
        }

    # ------------------------------------------------------------------ validation (run by @strict)
    def validate_widths(self) -> None:
        """The residual stream may be wider than the layers, never narrower."""
        _require(self.hidden_size > 0, "hidden_size", self.hidden_size, "a positive integer")
        _require(
            self.residual_size >= self.hidden_size,
            "residual_size",
            self.residual_size,
            f"an integer >= hidden_size ({self.hidden_size}); the wide stream cannot be narrower than a layer",
        )
        _require(self.vocab_size > 0, "vocab_size", self.vocab_size, "a positive integer")
        _require(self.intermediate_size > 0, "intermediate_size", self.intermediate_size, "a positive integer")

    def validate_blocks(self) -> None:
        """Blocks hold whole layers: L must split into blocks of k."""
        _require(self.layers_per_block > 0, "layers_per_block", self.layers_per_block, "a positive integer")
        _require(self.num_hidden_layers > 0, "num_hidden_layers", self.num_hidden_layers, "a positive integer")
        _require(
            self.num_hidden_layers % self.layers_per_block == 0,
            "layers_per_block",
            self.layers_per_block,
            f"a divisor of num_hidden_layers ({self.num_hidden_layers})",
        )

    def validate_hires_options(self) -> None:
        _require(self.write_mode in WRITE_MODES, "write_mode", self.write_mode, f"one of {WRITE_MODES}")
        _require(
            self.initializer_range > 0,
            "initializer_range",
            self.initializer_range,
            "a positive number (the std of the initial weights; the embedding multiplier defaults to its inverse)",
        )
        _require(
            self.projection_init in PROJECTION_INITS,
            "projection_init",
            self.projection_init,
            f"one of {PROJECTION_INITS}",
        )
        _require(self.qk_norm in QK_NORMS, "qk_norm", self.qk_norm, f"one of {QK_NORMS}")
        _require(
            self.write_multiplier > 0,
            "write_multiplier",
            self.write_multiplier,
            "a positive number (or None for the default: WRITE_BASE_WIDTH / hidden_size with the outer norm, else 1.0)",
        )
        _require(self.skip_scale > 0, "skip_scale", self.skip_scale, "a positive number (1.0: the plain residual)")
        _require(
            self.embedding_multiplier > 0,
            "embedding_multiplier",
            self.embedding_multiplier,
            "a positive number (or None for the default: 1 / initializer_range with the outer norm, else 1.0)",
        )

    def validate_attention(self) -> None:
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        _require(heads > 0, "num_attention_heads", heads, "a positive integer")
        _require(
            self.head_dim is not None,
            "num_attention_heads",
            heads,
            f"a divisor of hidden_size ({self.hidden_size}), or give head_dim explicitly",
        )
        _require(
            self.head_dim > 0 and self.head_dim % 2 == 0,
            "head_dim",
            self.head_dim,
            "a positive even integer (rotary embeddings rotate pairs of dimensions)",
        )
        _require(
            kv_heads > 0 and heads % kv_heads == 0,
            "num_key_value_heads",
            kv_heads,
            f"a positive divisor of num_attention_heads ({heads})",
        )
        if self.clip_qkv is not None:
            _require(self.clip_qkv > 0, "clip_qkv", self.clip_qkv, "None or a positive number")

    def validate_embeddings(self) -> None:
        """The embedding is V x D and the head V x d: they can only be one matrix when D == d."""
        if self.tie_word_embeddings:
            _require(
                self.residual_size == self.hidden_size,
                "tie_word_embeddings",
                self.tie_word_embeddings,
                f"False when residual_size ({self.residual_size}) != hidden_size ({self.hidden_size}): "
                "the embedding is vocab x residual_size, the head vocab x hidden_size",
            )

    def validate_experts(self) -> None:
        _require(self.num_experts >= 0, "num_experts", self.num_experts, "0 (dense) or a positive integer")
        _require(self.router_aux_loss_coef >= 0, "router_aux_loss_coef", self.router_aux_loss_coef, ">= 0")
        _require(self.router_z_loss_coef >= 0, "router_z_loss_coef", self.router_z_loss_coef, ">= 0")
        if not self.is_moe:
            return
        _require(
            1 <= self.num_experts_per_tok <= self.num_experts,
            "num_experts_per_tok",
            self.num_experts_per_tok,
            f"an integer in [1, num_experts={self.num_experts}]",
        )
        _require(
            self.moe_intermediate_size > 0, "moe_intermediate_size", self.moe_intermediate_size, "a positive integer"
        )

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "HiResConfig":
        """A named shape from `PRESETS`, with any field overridden by keyword."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}. Available presets: {', '.join(sorted(PRESETS))}.")
        return cls(**{**PRESETS[name], **overrides})


def _require(ok: bool, field: str, value: object, allowed: str) -> None:
    """Raise the one error shape every invalid field gets: the field, its value, and what is allowed."""
    if not ok:
        raise ValueError(f"Invalid HiResConfig: {field}={value!r}; allowed: {allowed}.")


_TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=172,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    residual_size=128,
    layers_per_block=2,
)


def shape_fields(
    hidden_size: int,
    num_hidden_layers: int,
    layers_per_block: int = 4,
    residual_ratio: float = 2.0,
    head_dim: int | None = None,
    vocab_size: int = 4096,
) -> dict[str, Any]:
    """The package's one rule from a size "d x L" to a config: heads of 64 from d = 128 up and of 32 below (so
    that d = 64 and 96 still get 2 and 3 heads), a SwiGLU width of 8d/3 rounded up to a multiple of 8, D = 2d,
    blocks of k = 4. The presets, `hires-hf compare --model DxL`, the sweep and the ladder all build shapes here."""
    head_dim = head_dim or (64 if hidden_size >= 128 else 32)
    head_dim = min(head_dim, hidden_size)
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=-(-8 * hidden_size // 24) * 8,  # ceil(8d/3 / 8) * 8
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=max(1, hidden_size // head_dim),
        head_dim=head_dim,
        residual_size=round(residual_ratio * hidden_size),
        layers_per_block=layers_per_block,
    )


# A dense ladder for scaling fits on a CPU: three blocks of four layers at growing width (the compute ladder's rungs,
# docs/research.md), and one wider.
_LADDER = {"ladder-1": 64, "ladder-2": 96, "ladder-3": 128, "ladder-4": 192}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _TINY,
    "tiny-moe": {
        **_TINY,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "qk_norm": "full",
        "router_z_loss_coef": 0.001,
    },
    **{name: {**shape_fields(d, 12), "max_position_embeddings": 1024} for name, d in _LADDER.items()},
    # Llama-3.2-1B's layers as HiRes with D = 2d, k = 4 (untied: the D-wide embedding cannot be the d-wide head).
    "dense-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        residual_size=4096,
        layers_per_block=4,
    ),
    # The released OLMoE-1B-7B shape, made HiRes with D = 2d and k = 4.
    "olmoe-1b-7b": dict(
        vocab_size=50304,
        hidden_size=2048,
        intermediate_size=1024,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=128,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        qk_norm="full",
        num_experts=64,
        num_experts_per_tok=8,
        moe_intermediate_size=1024,
        norm_topk_prob=False,
        router_aux_loss_coef=0.01,
        router_z_loss_coef=0.001,
        initializer_range=0.02,
        tie_word_embeddings=False,
        pad_token_id=1,
        bos_token_id=None,
        eos_token_id=50279,
        residual_size=4096,
        layers_per_block=4,
    ),
}


__all__ = ["PRESETS", "WRITE_BASE_WIDTH", "HiResConfig", "shape_fields"]
