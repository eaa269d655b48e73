"""bf16 autocast on a CPU without bf16 matrix units, near fp32's speed and with bf16's rounding.

Under bf16 autocast a matrix product takes bf16 operands, accumulates in fp32 and rounds its result to bf16;
attention does the same around its fp32 softmax. On a CPU without AMX or AVX512-BF16, oneDNN has no bf16 kernel
and torch falls back to a scalar one: 0.09-0.13x the speed of fp32 training (benchmarks/results/cpu_throughput/avx2).
The bf16 operands are exact in fp32, so an fp32 kernel on them computes the same products; rounding its result to
bf16 gives what a bf16 kernel gives, up to the order of the fp32 sums (which differs between bf16 kernels too).

`emulated_bf16()` does exactly that below autograd (a dispatch mode), for the forward and the backward alike, so the
loop, its autocast and its optimizer are untouched: a run trained under it is the same bf16 run, computed by other
kernels. `bf16_kernels()` says which kernels a run on this machine uses; the run store records it.

`torch.compile` does not trace under a dispatch mode: a run asked to compile trains eager here (on a CPU without bf16
units compiling bought x1.06-1.16 in fp32). Eager and compiled bf16 differ only in where elementwise results are
rounded, a smaller change than bf16 against fp32, which the ladder's precision check measured to be inside the seed
spread; a run's record (`bf16_kernels`) says it was emulated, hence eager.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .loop import bf16_matmul_hardware

aten = torch.ops.aten

# The ops whose bf16 kernels are slow without bf16 matrix units: the matrix products (forward and backward) and
# CPU attention (whose inner products are bf16 matrix products). Everything else is elementwise and fast.
EMULATED_OPS = frozenset(
    {
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten.baddbmm.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    }
)

NATIVE = "native bf16"
EMULATED = "fp32 kernels on bf16 operands, results rounded to bf16"

_state = threading.local()


def _widen(value: Any) -> Any:
    return value.float() if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 else value


def _narrow(value: Any) -> Any:
    return value.to(torch.bfloat16) if isinstance(value, torch.Tensor) else value


class EmulatedBF16(TorchDispatchMode):
    """Runs the bf16 calls of EMULATED_OPS with fp32 kernels and gives their results back in bf16."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func not in EMULATED_OPS or not any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args):
            return func(*args, **kwargs)
        result = func(*[_widen(a) for a in args], **{k: _widen(v) for k, v in kwargs.items()})
        if func is aten._scaled_dot_product_flash_attention_for_cpu.default:
            output, logsumexp = result  # the log-sum-exp is fp32 in the bf16 kernel too
            return _narrow(output), logsumexp
        return tuple(_narrow(r) for r in result) if isinstance(result, tuple) else _narrow(result)


@contextmanager
def emulated_bf16() -> Iterator[None]:
    """bf16 autocast's matrix products and attention computed by fp32 kernels while inside (this thread)."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        with EmulatedBF16():
            yield
    finally:
        _state.depth = depth


def emulating() -> bool:
    """Whether this thread is inside `emulated_bf16()`."""
    return getattr(_state, "depth", 0) > 0


def needs_emulation(device_type: str, precision: str) -> bool:
    """A bf16 run on a CPU without bf16 matrix units: the case `emulated_bf16` is for."""
    return precision == "bf16" and device_type == "cpu" and not bf16_matmul_hardware("cpu")


def bf16_kernels() -> str:
    """Which kernels this thread's bf16 matrix products run on: native or emulated."""
    return EMULATED if emulating() else NATIVE
