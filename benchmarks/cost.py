"""Cost half of the benchmark: what HiRes costs next to vanilla Llama / OLMoE and the residual-widening peers.

Every row has the same d-wide layers (compute width, depth, heads, FFN); only the residual wiring differs.
Columns, per row:
- train-step time (forward + backward, no optimizer step), timed in interleaved repetitions: every
  repetition runs every row once, so slow drift of a shared machine hits all rows alike; ratios are taken
  per repetition against the vanilla row of the same family, then summarised (median, min, max);
- decode tokens/s with the KV cache (greedy, one token at a time after a prefill), also interleaved;
- forward FLOPs per token counted by `FlopCounterMode` next to the analytic count of `hires_hf.accounting`;
- activation bytes kept for backward, measured with `saved_tensors_hooks` (distinct storages, parameters
  left out), with the share each module kind keeps;
- parameters.
The results are a JSON-able dict; `report.py` turns it into RESULTS.md and the figures.
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM

from hires_hf import HiResConfig, HiResForCausalLM
from hires_hf.accounting import forward_flops_per_token
from hires_hf.twins import num_experts, vanilla_config

from .peers import BlockAttnResForCausalLM, MHCForCausalLM, attnres_extra_flops_per_token, mhc_extra_flops_per_token

aten = torch.ops.aten


# ---------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class CostSettings:
    """The shared shape of every row and how long to measure; defaults fit a shared 2-core CPU."""

    hidden_size: int = 256
    num_layers: int = 8
    num_heads: int = 4
    intermediate_size: int | None = None  # None: SwiGLU width ~8d/3, rounded up to a multiple of 8
    vocab_size: int = 4096
    seq_len: int = 256
    batch_size: int = 4
    num_experts: int = 8
    experts_per_tok: int = 2
    expert_width: int | None = None  # None: d (OLMoE-1B-7B's expert width is d / 2 with 8 of 64 active)
    experts_implementation: str = "eager"  # the same kernel for OLMoE and HiRes-MoE; "eager" is fastest on CPU
    layers_per_block: tuple[int, ...] = (2, 4, 8)
    width_factors: tuple[int, ...] = (1, 2, 4)  # D = factor * d
    peer_streams: int = 4  # mHC streams
    peer_block_size: int = 4  # Block AttnRes layers per block (= the HiRes k the targets are stated at)
    include_moe: bool = True
    include_peers: bool = True
    repeats: int = 5
    warmup: int = 1
    prompt_len: int = 32
    decode_tokens: int = 32
    threads: int = 1
    seed: int = 0

    @property
    def ffn_width(self) -> int:
        return self.intermediate_size or 8 * math.ceil(8 * self.hidden_size / 3 / 8)

    def hires_config(self, moe: bool, k: int, factor: int) -> HiResConfig:
        """The HiRes config of one row; its layers are exactly those of the family's vanilla twin."""
        fields: dict[str, Any] = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.ffn_width,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            max_position_embeddings=max(self.seq_len, self.prompt_len + self.decode_tokens),
            residual_size=factor * self.hidden_size,
            layers_per_block=k,
        )
        if moe:  # OLMoE's layer: full-width q/k norm, no shared expert
            fields.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.experts_per_tok,
                moe_intermediate_size=self.expert_width or self.hidden_size,
                qk_norm="full",
            )
        return HiResConfig(**fields)


# ---------------------------------------------------------------------------------------------- rows
@dataclass
class RowSpec:
    """One model of the table: how to build it and what the accounting says it should cost."""

    name: str
    family: str  # "dense" or "moe": which vanilla row it is compared with
    kind: str  # "vanilla", "hires", "mhc" or "attnres"
    build: Callable[[], nn.Module]
    analytic_flops: float  # forward FLOPs per token, causal, the convention of docs/architecture.md (cost accounting)
    analytic_overhead: float  # relative to the family's vanilla row
    layers_per_block: int | None = None
    width_factor: int | None = None


def row_specs(settings: CostSettings) -> list[RowSpec]:
    """Vanilla first in each family, then HiRes for every (k, D), then the peers."""
    specs: list[RowSpec] = []
    for moe in (False, True) if settings.include_moe else (False,):
        family = "moe" if moe else "dense"
        twin_source = settings.hires_config(moe, settings.layers_per_block[0], 1)  # any HiRes row: same layers
        twin = vanilla_config(twin_source)
        seq = settings.seq_len
        base_flops = forward_flops_per_token(
            settings.hires_config(moe, settings.layers_per_block[0], 1), seq, vanilla=True
        )
        specs.append(
            RowSpec(
                "OLMoE" if moe else "Llama",
                family,
                "vanilla",
                _vanilla_builder(twin, settings.experts_implementation),
                base_flops,
                0.0,
            )
        )
        for k in settings.layers_per_block:
            for factor in settings.width_factors:
                config = settings.hires_config(moe, k, factor)
                flops = forward_flops_per_token(config, seq)
                specs.append(
                    RowSpec(
                        f"HiRes{'-MoE' if moe else ''} k={k} D={factor}d",
                        family,
                        "hires",
                        _hires_builder(config, settings.experts_implementation),
                        flops,
                        flops / base_flops - 1.0,
                        k,
                        factor,
                    )
                )
        if settings.include_peers and not moe:
            n, block = settings.peer_streams, settings.peer_block_size
            mhc_flops = base_flops + mhc_extra_flops_per_token(twin, n)
            specs.append(
                RowSpec(
                    f"mHC-{n}",
                    family,
                    "mhc",
                    _peer_builder(MHCForCausalLM, twin, n),
                    mhc_flops,
                    mhc_flops / base_flops - 1,
                )
            )
            attnres_flops = base_flops + attnres_extra_flops_per_token(twin, block)
            specs.append(
                RowSpec(
                    f"Block AttnRes (block={block})",
                    family,
                    "attnres",
                    _peer_builder(BlockAttnResForCausalLM, twin, block),
                    attnres_flops,
                    attnres_flops / base_flops - 1,
                    block,
                )
            )
    return specs


def _vanilla_builder(config, experts_implementation: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if num_experts(config):
            return AutoModelForCausalLM.from_config(config, experts_implementation=experts_implementation)
        return AutoModelForCausalLM.from_config(config)

    return build


def _hires_builder(config: HiResConfig, experts_implementation: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if config.is_moe:
            return HiResForCausalLM._from_config(config, experts_implementation=experts_implementation)
        return HiResForCausalLM._from_config(config)

    return build


def _peer_builder(cls: type, config, size: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        peer_config = config.__class__.from_dict(config.to_dict())  # the peer may set the attention backend
        return cls(peer_config, size)

    return build


# ---------------------------------------------------------------------------------------------- measurements
def train_step_seconds(model: nn.Module, input_ids: torch.Tensor) -> float:
    """Wall time of one forward (with the LM loss) + backward; gradients are dropped afterwards."""
    model.train()
    start = time.perf_counter()
    model(input_ids=input_ids, labels=input_ids).loss.backward()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


@torch.inference_mode()
def decode_tokens_per_second(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> float:
    """Greedy decoding with the KV cache: tokens per second over the one-token steps (the prefill is not timed)."""
    model.eval()
    out = model(input_ids=prompt, use_cache=True)
    cache, next_ids = out.cache, out.logits[:, -1:].argmax(-1)  # next_ids: (B, 1)
    start = time.perf_counter()
    for _ in range(new_tokens):
        out = model(input_ids=next_ids, cache=cache, use_cache=True)
        next_ids = out.logits[:, -1:].argmax(-1)
    return prompt.shape[0] * new_tokens / (time.perf_counter() - start)


def _sdpa_flops(query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, *args, out_shape=None, **kwargs):
    """QK^T and PV of a fused attention, counting only the (query, key) pairs a causal kernel visits."""
    batch, heads, q_len, head_dim = query
    k_len, v_dim = key[-2], value[-1]
    if is_causal:  # top-left aligned, as torch's is_causal: query i sees keys 0..i
        pairs = sum(min(i + 1, k_len) for i in range(q_len))
    else:
        pairs = q_len * k_len
    return 2 * batch * heads * pairs * (head_dim + v_dim)


def _grouped_mm_flops(a, b, offs=None, bias=None, out_dtype=None, *args, out_shape=None, **kwargs):
    """A grouped matmul does each row's product once, whatever the grouping: 2 x rows x inner x outer."""
    if len(a) == 2 and len(b) == 2:  # (M, K_total) x (K_total, N), groups split K
        return 2 * a[0] * a[1] * b[1]
    rows = math.prod(a[:-1])
    return 2 * rows * a[-1] * b[-1]


# FlopCounterMode has no formula for these (its totals would miss attention on CPU and the grouped experts).
EXTRA_FLOP_FORMULAS: dict[Any, Callable] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops,
    aten._grouped_mm: _grouped_mm_flops,
}


@torch.no_grad()
def counted_forward_flops_per_token(model: nn.Module, input_ids: torch.Tensor) -> float:
    """FLOPs of one forward pass as FlopCounterMode counts them, per token."""
    model.eval()
    with FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS) as counter:
        model(input_ids=input_ids)
    return counter.get_total_flops() / input_ids.numel()


def saved_activation_bytes(model: nn.Module, input_ids: torch.Tensor) -> tuple[int, dict[str, int]]:
    """Bytes autograd keeps for backward over one forward with the LM loss, and their split by module kind."""
    model.train()

    def forward() -> torch.Tensor:
        return model(input_ids=input_ids, labels=input_ids).loss

    return measure_saved_tensors(forward, model)


def measure_saved_tensors(run: Callable[[], Any], model: nn.Module) -> tuple[int, dict[str, int]]:
    """Bytes of the distinct storages autograd saves for backward while `run()` executes, and their split.

    Each storage counts once (views and repeated saves of one tensor share it); the model's parameters are
    left out (they are kept anyway). A storage is charged to the innermost module of `model` running when
    it is first saved, named by its path without indices (`model.blocks.0.read_proj` -> `read_proj`).
    Whatever `run()` returns is dropped before returning, so its graph is freed.
    """
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    names = {module: _kind_name(name) for name, module in model.named_modules()}
    stack: list[str] = []
    seen: dict[int, int] = {}
    by_module: dict[str, int] = defaultdict(int)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in param_storages and key not in seen:
            seen[key] = storage.nbytes()
            by_module[stack[-1] if stack else "(outside the model)"] += storage.nbytes()
        return tensor

    def enter(module: nn.Module, _args) -> None:
        stack.append(names.get(module, type(module).__name__))

    def leave(module: nn.Module, _args, _output) -> None:
        stack.pop()

    pre = torch.nn.modules.module.register_module_forward_pre_hook(enter)
    post = torch.nn.modules.module.register_module_forward_hook(leave)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            output = run()
    finally:
        pre.remove()
        post.remove()
    del output
    return sum(seen.values()), dict(by_module)


def _kind_name(qualified: str) -> str:
    """'model.layers.2.self_attn.q_proj' -> 'self_attn.q_proj': what kind of module, not which one."""
    parts = [part for part in qualified.split(".") if part and not part.isdigit()]
    keep = [p for p in parts if p not in ("model", "blocks", "layers")]
    return ".".join(keep[-2:]) if keep else "(top level: loss, logits)"


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------- the run
@dataclass
class RowResult:
    """Raw measurements of one row.

    `train_seconds` / `decode_tokens_per_second`: one entry per timed run, in order. For a non-vanilla row,
    `reference_*` holds the family's vanilla timing taken right next to each of them (its pair).
    """

    name: str
    family: str
    kind: str
    layers_per_block: int | None
    width_factor: int | None
    params: int
    analytic_flops: float
    analytic_overhead: float
    counted_flops: float
    activation_bytes: int
    activation_by_module: dict[str, int]
    train_seconds: list[float] = field(default_factory=list)
    decode_tokens_per_second: list[float] = field(default_factory=list)
    reference_train_seconds: list[float] = field(default_factory=list)
    reference_decode_tokens_per_second: list[float] = field(default_factory=list)


def run_cost(settings: CostSettings, progress: bool = True) -> dict[str, Any]:
    """Build every row, measure it, and return settings + raw rows + summaries + target verdicts."""
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)
    batch = torch.randint(0, settings.vocab_size, (settings.batch_size, settings.seq_len), generator=generator)
    prompt = batch[:, : settings.prompt_len]

    specs = row_specs(settings)
    models = {}
    results: dict[str, RowResult] = {}
    for spec in tqdm(specs, desc="build + count FLOPs + activations", disable=not progress):
        torch.manual_seed(settings.seed)
        model = models[spec.name] = spec.build()
        activation, by_module = saved_activation_bytes(model, batch)
        results[spec.name] = RowResult(
            name=spec.name,
            family=spec.family,
            kind=spec.kind,
            layers_per_block=spec.layers_per_block,
            width_factor=spec.width_factor,
            params=count_parameters(model),
            analytic_flops=spec.analytic_flops,
            analytic_overhead=spec.analytic_overhead,
            counted_flops=counted_forward_flops_per_token(model, batch),
            activation_bytes=activation,
            activation_by_module=by_module,
        )
        gc.collect()

    vanilla = {spec.family: spec.name for spec in specs if spec.kind == "vanilla"}
    others = [spec for spec in specs if spec.kind != "vanilla"]
    shuffler = random.Random(settings.seed)
    total = (settings.warmup + settings.repeats) * len(others)
    with tqdm(total=total, desc="paired timing", disable=not progress) as bar:
        for repetition in range(settings.warmup + settings.repeats):
            shuffler.shuffle(others)  # a fresh row order each repetition
            for index, spec in enumerate(others):
                # Each row is timed right next to its vanilla reference (alternating which goes first), so a
                # burst of load from other processes hits both sides of a ratio alike.
                pair = [vanilla[spec.family], spec.name]
                if (index + repetition) % 2:
                    pair.reverse()
                timings = {name: _time_once(models[name], batch, prompt, settings.decode_tokens) for name in pair}
                if repetition >= settings.warmup:
                    row, reference = results[spec.name], results[vanilla[spec.family]]
                    for result, name in ((row, spec.name), (reference, vanilla[spec.family])):
                        result.train_seconds.append(timings[name][0])
                        result.decode_tokens_per_second.append(timings[name][1])
                    row.reference_train_seconds.append(timings[vanilla[spec.family]][0])
                    row.reference_decode_tokens_per_second.append(timings[vanilla[spec.family]][1])
                bar.update()

    rows = [asdict(results[spec.name]) for spec in specs]
    return {"settings": _settings_dict(settings), "rows": rows, "summary": summarize(rows), "targets": targets(rows)}


def _time_once(model: nn.Module, batch: torch.Tensor, prompt: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """(train-step seconds, decode tokens/s) of one model, measured back to back."""
    return train_step_seconds(model, batch), decode_tokens_per_second(model, prompt, new_tokens)


def _settings_dict(settings: CostSettings) -> dict[str, Any]:
    values = asdict(settings)
    values["ffn_width"] = settings.ffn_width
    values["expert_width"] = settings.expert_width or settings.hidden_size
    return values


# ---------------------------------------------------------------------------------------------- summaries
def _ratios(values: list[float], reference: list[float]) -> list[float]:
    """Ratios of paired timings: each run of a row against the vanilla run taken next to it."""
    return [value / ref for value, ref in zip(values, reference)]


def _stats(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """min / median of the raw timings, and paired ratios against the family's vanilla row, per row."""
    vanilla = {row["family"]: row for row in rows if row["kind"] == "vanilla"}
    summary = {}
    for row in rows:
        ref = vanilla[row["family"]]
        # The vanilla row is its own reference: its ratios are exactly 1.
        train_ref = row["reference_train_seconds"] or row["train_seconds"]
        decode_ref = row["reference_decode_tokens_per_second"] or row["decode_tokens_per_second"]
        summary[row["name"]] = {
            "train_seconds": _stats(row["train_seconds"]),
            "decode_tokens_per_second": _stats(row["decode_tokens_per_second"]),
            "train_ratio": _stats(_ratios(row["train_seconds"], train_ref)),
            "decode_ratio": _stats(_ratios(row["decode_tokens_per_second"], decode_ref)),
            "activation_ratio": row["activation_bytes"] / ref["activation_bytes"],
            "flops_ratio_counted": row["counted_flops"] / ref["counted_flops"],
            "params_ratio": row["params"] / ref["params"],
        }
    return summary


TRAIN_SLACK = 0.03  # HiRes step time <= vanilla x (1 + analytic overhead + 0.03)
MOE_SLACK = 0.05  # HiRes-MoE step time <= OLMoE x (1.05 + analytic overhead)
DECODE_FLOOR = 0.95  # decode tokens/s >= 0.95 x vanilla
ACTIVATION_CEILING = 1.10  # activation bytes <= 1.10 x vanilla at D = 2d, k = 4


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every cost target, one verdict per (target, row); time targets use the median paired ratio."""
    summary = summarize(rows)
    by_name = {row["name"]: row for row in rows}
    peers = [row for row in rows if row["kind"] in ("mhc", "attnres")]
    verdicts = []
    for row in rows:
        if row["kind"] != "hires":
            continue
        name, stats, overhead = row["name"], summary[row["name"]], row["analytic_overhead"]
        moe = row["family"] == "moe"
        what = "step time vs OLMoE" if moe else "step time vs Llama"
        limit = 1.0 + overhead + (MOE_SLACK if moe else TRAIN_SLACK)
        note = f"analytic FLOPs overhead {overhead:+.1%}"
        verdicts.append(_verdict(what, name, stats["train_ratio"]["median"], "<=", limit, note))
        # Decoding a small model is compute- or weight-read-bound: extra FLOPs cap the ratio near 1/(1+overhead).
        note = f"1/(1 + FLOPs overhead) = {1 / (1 + overhead):.3f}"
        decode = stats["decode_ratio"]["median"]
        verdicts.append(_verdict("decode tokens/s vs vanilla", name, decode, ">=", DECODE_FLOOR, note))
        if row["layers_per_block"] == 4 and row["width_factor"] == 2:
            activation = stats["activation_ratio"]
            verdicts.append(_verdict("activation bytes vs vanilla", name, activation, "<=", ACTIVATION_CEILING))
            if row["family"] == "dense":
                for peer in peers:
                    ratio = row["activation_bytes"] / by_name[peer["name"]]["activation_bytes"]
                    verdicts.append(_verdict(f"activation bytes vs {peer['name']}", name, ratio, "<", 1.0))
    return verdicts


def _verdict(target: str, row: str, value: float, relation: str, limit: float, note: str = "") -> dict[str, Any]:
    met = {"<=": value <= limit, "<": value < limit, ">=": value >= limit}[relation]
    return {
        "target": target,
        "row": row,
        "value": value,
        "relation": relation,
        "limit": limit,
        "met": met,
        "note": note,
    }


# ---------------------------------------------------------------------------------------------- profiling
def profile_ops(work: Callable[[], Any], repeats: int = 2) -> dict[str, float]:
    """Self CPU time (ms) per op over one call of `work`, averaged over `repeats` calls after a warm one."""
    from torch.profiler import ProfilerActivity, profile

    work()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            work()
    return {event.key: event.self_cpu_time_total / 1000 / repeats for event in prof.key_averages()}


def profile_difference(
    row_work: Callable[[], Any], reference_work: Callable[[], Any], top: int = 8
) -> list[tuple[str, float, float]]:
    """All ops' total, then the ops whose self time grows most from the reference to the row:
    (op, reference ms, row ms)."""
    mine, theirs = profile_ops(row_work), profile_ops(reference_work)
    ops = sorted(set(mine) | set(theirs), key=lambda op: theirs.get(op, 0.0) - mine.get(op, 0.0))
    total = ("(all ops)", sum(theirs.values()), sum(mine.values()))
    return [total, *((op, theirs.get(op, 0.0), mine.get(op, 0.0)) for op in ops[:top])]


def _margin(verdict: dict[str, Any]) -> float:
    """How far a verdict is on the right side of its limit (negative: missed by that much)."""
    if verdict["relation"].startswith("<"):
        return verdict["limit"] - verdict["value"]
    return verdict["value"] - verdict["limit"]


def profile_misses(settings: CostSettings, result: dict[str, Any]) -> list[dict[str, Any]]:
    """torch.profiler comparison, against vanilla, of the worst miss of each time target (step time per family,
    decode): the ops whose time grows most say where the extra time goes."""
    worst: dict[str, dict[str, Any]] = {}
    for verdict in sorted(result["targets"], key=_margin):
        if not verdict["met"] and (verdict["target"].startswith("step time") or verdict["target"].startswith("decode")):
            worst.setdefault(verdict["target"], verdict)
    specs = {spec.name: spec for spec in row_specs(settings)}
    reference = {spec.family: spec for spec in specs.values() if spec.kind == "vanilla"}
    torch.set_num_threads(settings.threads)
    batch = torch.randint(0, settings.vocab_size, (settings.batch_size, settings.seq_len))
    prompt = batch[:, : settings.prompt_len]
    profiles = []
    for target, verdict in worst.items():
        spec = specs[verdict["row"]]
        torch.manual_seed(settings.seed)
        row, ref = spec.build(), reference[spec.family].build()
        if target.startswith("decode"):
            what = f"decode, {settings.decode_tokens} tokens"
            ops = profile_difference(
                partial(decode_tokens_per_second, row, prompt, settings.decode_tokens),
                partial(decode_tokens_per_second, ref, prompt, settings.decode_tokens),
            )
        else:
            what = "train step"
            ops = profile_difference(partial(train_step_seconds, row, batch), partial(train_step_seconds, ref, batch))
        profiles.append({"row": spec.name, "reference": reference[spec.family].name, "what": what, "ops": ops})
    return profiles


__all__ = [
    "CostSettings",
    "RowSpec",
    "counted_forward_flops_per_token",
    "decode_tokens_per_second",
    "measure_saved_tensors",
    "profile_difference",
    "profile_misses",
    "profile_ops",
    "row_specs",
    "run_cost",
    "saved_activation_bytes",
    "summarize",
    "targets",
    "train_step_seconds",
]
