"""GPU section: bf16 training throughput and model FLOPs utilisation, HiRes next to its vanilla twin.

Shapes: a ~1B dense model (Llama-3.2-1B's layers: d=2048, 16 layers, 32 heads / 8 kv heads, SwiGLU 8192) and
the released OLMoE-1B-7B shape (`HiResConfig.from_preset("olmoe-1b-7b")`), each as HiRes with D = 2d, k = 4
and as its transformers twin (Llama / OLMoE). Attention: sdpa, and flash_attention_2 where it is installed.
MFU counts the analytic training FLOPs of `hires_hf.accounting` (3 x causal forward), so HiRes is credited
with its read / write projections and nothing else. Without CUDA the section says so and is skipped.
"""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.benchmark import Timer
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM

from hires_hf import HiResConfig, HiResForCausalLM
from hires_hf.accounting import forward_flops_per_token
from hires_hf.twins import vanilla_config

# Dense bf16 peak of the tensor cores (no sparsity), by device name; anything else needs --peak-tflops.
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0, "L4": 121.0}
MFU_POINTS = 0.03  # target: HiRes MFU within 3 points of its vanilla twin


SHAPES = {name: (lambda name=name: HiResConfig.from_preset(name)) for name in ("dense-1b", "olmoe-1b-7b")}


@dataclass(frozen=True)
class GpuSettings:
    shapes: tuple[str, ...] = ("dense-1b", "olmoe-1b-7b")
    seq_len: int = 2048
    batch_size: int = 4
    steps: int = 8
    warmup: int = 3
    experts_implementation: str = "grouped_mm"
    peak_tflops: float | None = None


def attention_backends() -> tuple[list[str], list[str]]:
    """(backends to run, reasons for those left out)."""
    from transformers.utils import is_flash_attn_2_available

    if is_flash_attn_2_available():
        return ["sdpa", "flash_attention_2"], []
    return ["sdpa"], ["flash_attention_2: the flash-attn package is not installed"]


def peak_flops(settings: GpuSettings) -> tuple[float, str]:
    """Peak bf16 FLOP/s of device 0 and where the number comes from."""
    if settings.peak_tflops:
        return settings.peak_tflops * 1e12, "given with --peak-tflops"
    name = torch.cuda.get_device_name(0)
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in name:
            return tflops * 1e12, f"{name} dense bf16 datasheet value"
    raise ValueError(f"Unknown peak bf16 FLOP/s for {name!r}; pass --peak-tflops.")


def build(config: HiResConfig, vanilla: bool, attention: str, experts: str, device: str, dtype) -> nn.Module:
    """The HiRes model or its twin, created directly on `device` in `dtype` (a 7B model never touches host RAM)."""
    kwargs: dict[str, Any] = {"attn_implementation": attention, "dtype": dtype}
    if config.is_moe:
        kwargs["experts_implementation"] = experts
    with torch.device(device):
        if vanilla:
            return AutoModelForCausalLM.from_config(vanilla_config(config), **kwargs)
        return HiResForCausalLM._from_config(config, **kwargs)


def train_tokens_per_second(model: nn.Module, input_ids: torch.Tensor, steps: int, warmup: int) -> float:
    """Forward + LM loss + backward; tokens per second over the timed steps (torch's Timer synchronises the
    device and adds two warm-up steps of its own to ours)."""
    model.train()

    def step() -> None:
        model(input_ids=input_ids, labels=input_ids).loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    timer = Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
    return input_ids.numel() / timer.timeit(steps).mean


def run_gpu(settings: GpuSettings, progress: bool = True) -> dict[str, Any]:
    """All (shape, attention, HiRes | vanilla) rows, or a `skipped` reason without CUDA."""
    if not torch.cuda.is_available():
        return {"skipped": "Skipped: no CUDA device on the machine that ran the command (CPU-only torch or no GPU)."}
    backends, not_run = attention_backends()
    peak, peak_source = peak_flops(settings)
    runs = [
        (shape, attention, vanilla) for shape in settings.shapes for attention in backends for vanilla in (True, False)
    ]
    rows = []
    for shape, attention, vanilla in tqdm(runs, desc="GPU throughput", disable=not progress):
        config = SHAPES[shape]()
        config.max_position_embeddings = max(config.max_position_embeddings, settings.seq_len)
        model = build(config, vanilla, attention, settings.experts_implementation, "cuda", torch.bfloat16)
        ids = torch.randint(0, config.vocab_size, (settings.batch_size, settings.seq_len), device="cuda")
        torch.cuda.reset_peak_memory_stats()
        tokens_per_second = train_tokens_per_second(model, ids, settings.steps, settings.warmup)
        train_flops = 3 * forward_flops_per_token(config, settings.seq_len, vanilla=vanilla)
        rows.append(
            {
                "shape": shape,
                "attention": attention,
                "model": f"vanilla ({type(model).__name__})" if vanilla else "HiRes",
                "vanilla": vanilla,
                "params": sum(p.numel() for p in model.parameters()),
                "tokens_per_second": tokens_per_second,
                "train_flops_per_token": train_flops,
                "mfu": tokens_per_second * train_flops / peak,
                "peak_memory_bytes": torch.cuda.max_memory_allocated(),
            }
        )
        del model, ids
        gc.collect()
        torch.cuda.empty_cache()
    return {
        "settings": asdict(settings),
        "peak_tflops": peak / 1e12,
        "peak_source": peak_source,
        "rows": rows,
        "not_run": not_run,
        "targets": mfu_targets(rows),
    }


def mfu_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """HiRes MFU minus vanilla MFU per (shape, attention); met when it is no more than 3 points lower."""
    verdicts = []
    for hires in (r for r in rows if not r["vanilla"]):
        twin = next(
            r for r in rows if r["vanilla"] and (r["shape"], r["attention"]) == (hires["shape"], hires["attention"])
        )
        gap = hires["mfu"] - twin["mfu"]
        verdicts.append({"row": f"{hires['shape']} / {hires['attention']}", "value": gap, "met": gap >= -MFU_POINTS})
    return verdicts


__all__ = ["SHAPES", "GpuSettings", "build", "mfu_targets", "run_gpu", "train_tokens_per_second"]
