"""The bf16-kernels-against-fp32-kernels benchmark: one smoke run writes its report from runs that record both."""

from __future__ import annotations

import json

from benchmarks import bf16_emulation
from hires_hf.training.bf16_emulation import EMULATED, needs_emulation


def test_the_smoke_retrains_the_precision_checks_bf16_runs_and_reports_them(tmp_path, capsys):
    assert bf16_emulation.main(["--smoke", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "bf16_emulation.json").read_text())
    assert set(summary["arms"]) == {"control", "hires"}
    for arm in summary["arms"].values():
        assert arm["emulated_machine"]["bf16_kernels"] == EMULATED
        assert 0 < arm["seed_spread"] and abs(arm["difference"]) < arm["seed_spread"]
        if needs_emulation("cpu", "bf16"):  # emulated on both sides here: one plan, one result, to the last bit
            assert arm["difference"] == 0 and arm["largest_curve_difference"] == 0
    assert (tmp_path / "bf16_emulation.png").stat().st_size > 0
    assert "| control |" in (tmp_path / "bf16_emulation.md").read_text() and "| hires |" in capsys.readouterr().out
