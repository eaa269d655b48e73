"""bf16 autocast computed by fp32 kernels (for CPUs without bf16 matrix units) is the same bf16 computation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hires_hf.training.bf16_emulation import emulated_bf16, emulating, needs_emulation
from tests.util import tiny_hires


def _loss_and_grads(model: torch.nn.Module, batch: torch.Tensor, precision: str) -> tuple[float, torch.Tensor]:
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32"):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_matrix_products_and_attention_round_like_the_bf16_kernels():
    """Forward and backward of a bf16 linear layer and of attention: within bf16's rounding of the native kernels,
    results in bf16 as autocast gives them."""
    torch.manual_seed(0)
    x = torch.randn(64, 96, requires_grad=True)
    layer = torch.nn.Linear(96, 80)
    q, k, v = (torch.randn(2, 2, 32, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    results = {}
    for name in ("native", "emulated"):
        x.grad = layer.weight.grad = q.grad = k.grad = v.grad = None
        with emulated_bf16() if name == "emulated" else torch.autocast("cpu", enabled=False):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = layer(x)
            attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            (y.float().square().sum() + attention.float().square().sum()).backward()
        results[name] = [y, attention, x.grad, layer.weight.grad, q.grad, k.grad, v.grad]
    for native, emulated in zip(results["native"], results["emulated"], strict=True):
        assert emulated.dtype == native.dtype
        torch.testing.assert_close(emulated, native, rtol=2e-2, atol=2e-2)
    assert results["emulated"][0].dtype == torch.bfloat16


def test_a_hires_model_under_emulation_matches_the_bf16_kernels_within_bf16_rounding():
    """Loss and every gradient of a HiRes model: the emulated bf16 step is the native one up to the kernels'
    rounding (bf16 keeps 8 bits: a relative difference of 2**-7 is one rounding)."""
    torch.manual_seed(0)
    model = tiny_hires()
    batch = torch.randint(3, model.config.vocab_size, (4, 32))
    native_loss, native = _loss_and_grads(model, batch, "bf16")
    with emulated_bf16():
        assert emulating()
        emulated_loss, emulated = _loss_and_grads(model, batch, "bf16")
    assert not emulating()
    assert abs(emulated_loss - native_loss) < 1e-3 * native_loss
    assert _relative(emulated, native) < 2**-6


def test_only_bf16_runs_on_a_cpu_without_bf16_units_are_emulated(monkeypatch):
    from hires_hf.training import bf16_emulation

    monkeypatch.setattr(bf16_emulation, "bf16_matmul_hardware", lambda device_type: False)
    assert needs_emulation("cpu", "bf16")
    assert not needs_emulation("cpu", "fp32") and not needs_emulation("cuda", "bf16")
    monkeypatch.setattr(bf16_emulation, "bf16_matmul_hardware", lambda device_type: True)
    assert not needs_emulation("cpu", "bf16")
