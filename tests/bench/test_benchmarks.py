"""The benchmark harness: its measurements are right on hand-checkable cases, and one tiny run writes a report."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from benchmarks import report
from benchmarks.cost import CostSettings, measure_saved_tensors, row_specs, run_cost
from benchmarks.gpu import GpuSettings, mfu_targets, run_gpu, train_tokens_per_second
from benchmarks.peers import BlockAttnResForCausalLM, MHCForCausalLM
from hires_hf.accounting import count_parameters

TINY = CostSettings(
    hidden_size=32,
    num_layers=4,
    num_heads=2,
    vocab_size=128,
    seq_len=16,
    batch_size=2,
    num_experts=4,
    experts_per_tok=2,
    layers_per_block=(2, 4),
    width_factors=(1, 2),
    peer_block_size=2,
    repeats=2,
    warmup=0,
    prompt_len=8,
    decode_tokens=2,
)


class _Probe(nn.Module):
    """x -> relu(proj(x)) -> (.)^2, with every saved tensor predictable by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.proj(x))  # Linear saves x (and its weight); relu saves its output
        head = torch.sin(x[:, :4])  # saves a view of x: the same storage, counted once
        return (hidden * hidden).sum() + head.sum()  # saves `hidden` twice: counted once


def test_saved_bytes_count_each_storage_once_and_skip_parameters():
    probe = _Probe()
    x = torch.randn(4, 8, requires_grad=True)
    total, by_module = measure_saved_tensors(lambda: probe(x), probe)
    x_bytes, hidden_bytes = 4 * 8 * 4, 4 * 16 * 4  # float32
    assert total == x_bytes + hidden_bytes
    assert by_module == {"proj": x_bytes, "(top level: loss, logits)": hidden_bytes}


@pytest.mark.parametrize("peer", [MHCForCausalLM, BlockAttnResForCausalLM], ids=["mhc", "attnres"])
def test_peer_decoding_with_cache_matches_full_forward(peer):
    """The decode benchmark times real cached decoding: cached logits equal a full re-forward."""
    settings = TINY
    twin = next(spec for spec in row_specs(settings) if spec.kind == "vanilla").build().config
    model = peer(twin.__class__.from_dict(twin.to_dict()), 2).eval()
    ids = torch.randint(0, settings.vocab_size, (2, 10))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        first = model(input_ids=ids[:, :7], use_cache=True)
        rest = model(input_ids=ids[:, 7:], cache=first.cache, use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], dim=1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_tiny_cost_run_counts_what_the_accounting_predicts_and_writes_a_report(tmp_path):
    result = run_cost(TINY, progress=False)
    names = [row["name"] for row in result["rows"]]
    assert names == [spec.name for spec in row_specs(TINY)]
    assert {"Llama", "OLMoE", "mHC-4", "Block AttnRes (block=2)", "HiRes-MoE k=4 D=2d"} <= set(names)
    for row in result["rows"]:
        # FlopCounterMode on the real model agrees with the analytic count (matmuls, causal attention pairs).
        assert row["counted_flops"] == pytest.approx(row["analytic_flops"], rel=1e-9), row["name"]
        assert min(row["train_seconds"]) > 0 and min(row["decode_tokens_per_second"]) > 0
        if row["kind"] != "vanilla":  # each timed run has its adjacent vanilla run
            assert len(row["train_seconds"]) == len(row["reference_train_seconds"]) == TINY.repeats
            assert len(row["decode_tokens_per_second"]) == len(row["reference_decode_tokens_per_second"])
        if row["kind"] == "hires":
            config = TINY.hires_config(row["family"] == "moe", row["layers_per_block"], row["width_factor"])
            assert row["params"] == count_parameters(config)
    summary = result["summary"]
    assert summary["Llama"]["train_ratio"]["median"] == 1.0
    assert summary["mHC-4"]["activation_ratio"] > summary["HiRes k=4 D=2d"]["activation_ratio"] > 1.0
    checked = {(v["target"], v["row"]) for v in result["targets"]}
    assert ("activation bytes vs vanilla", "HiRes k=4 D=2d") in checked
    assert ("step time vs OLMoE", "HiRes-MoE k=2 D=1d") in checked

    result |= {"command": "pytest", "environment": report.environment(), "load_average_end": 0.0}
    report.save_json(tmp_path / "results" / "cost" / "cost.json", result)
    text = report.write_results(tmp_path).read_text()
    assert all(f"| {name} |" in text for name in names)
    assert "## Compute ladder" in text and (tmp_path / "results" / "cost" / "cost_ratios.png").stat().st_size > 0
    assert "![cost_ratios.png](results/cost/cost_ratios.png)" in text


def test_results_md_is_built_from_every_experiment_folder_the_ladder_first_and_the_archive_listed(tmp_path):
    """One folder an experiment; each links its figures from its own folder, RESULTS.md from the benchmarks'.
    The compute ladder (the verdict) comes first, then the design sweep that chose the defaults."""
    results = tmp_path / "results"
    for name, text in {
        "ladder/ladder.md": "# Compute ladder\n\n```\nhires-hf ladder\n# a shell comment\n```\n![ladder](ladder.png)\n",
        "sweep/128x16/sweep.md": "# Design sweep at 128x16\n\nverdict\n\n## Length check\n\n![s](sweep.png)\n",
        "stability/stability.md": "## Stability grid\n\n![grid](stability.png)\n",
        "demo/table.md": "| model | loss |\n|---|---:|\n| control | 3.6 |\n",
        "archive/ladder_k4/ladder_k4.md": "## Ladder at k = 4 (old defaults)\n\n![fit](scaling_fit.png)\n",
    }.items():
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text(text)
    text = report.write_results(tmp_path).read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[:2] == ["## Compute ladder", "## Design sweep at 128x16"] and "### Length check" in text
    assert "![ladder](results/ladder/ladder.png)" in text
    assert "\n# a shell comment\n" in text  # a code block's comment is not a heading to demote
    assert "![s](results/sweep/128x16/sweep.png)" in text and "![grid](results/stability/stability.png)" in text
    assert "## From `results/demo/table.md`" in text and "| control | 3.6 |" in text
    assert "Not run yet: `python -m benchmarks --only cost`" in text
    assert sections[-1] == "## Archive: superseded runs"
    assert "- [Ladder at k = 4 (old defaults)](results/archive/ladder_k4/ladder_k4.md)" in text
    assert "scaling_fit.png" not in text  # an archived run is listed, not inlined


def test_bench_command_skips_gpu_without_cuda_and_rejects_bad_blocks(tmp_path, capsys):
    from benchmarks.cli import main  # `python -m benchmarks`

    assert main(["--only", "cost", "--layers", "6", "--layers-per-block", "4"]) == 2
    assert "does not divide" in capsys.readouterr().err
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU section would run for real")
    assert main(["--only", "gpu", "--output-dir", str(tmp_path), "--quiet"]) == 0
    assert "no CUDA device" in (tmp_path / "RESULTS.md").read_text()


class _SlowStep(nn.Module):
    """A "model" whose training step takes at least `seconds` (a sleep in its forward)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.weight, self.calls = seconds, nn.Parameter(torch.ones(())), 0

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor):
        self.calls += 1
        time.sleep(self.seconds)
        return SimpleNamespace(loss=self.weight * input_ids.float().mean())


def test_gpu_throughput_is_tokens_over_the_timed_step_time():
    """16 tokens a step, each step >= 20 ms: at most 800 tokens/s, and not far below on any machine; the warm-up
    steps run but are not timed."""
    model = _SlowStep(0.02)
    rate = train_tokens_per_second(model, torch.ones(2, 8, dtype=torch.long), steps=5, warmup=3)
    assert 800 / 4 < rate <= 800
    assert model.calls >= 3 + 5


def test_gpu_section_and_mfu_rule():
    """Without CUDA the section says it skipped; the MFU rule allows HiRes at most 3 points below vanilla."""
    if not torch.cuda.is_available():
        assert "skipped" in run_gpu(GpuSettings(), progress=False)
    rows = [
        {"shape": "s", "attention": "sdpa", "vanilla": True, "mfu": 0.50},
        {"shape": "s", "attention": "sdpa", "vanilla": False, "mfu": 0.475},
        {"shape": "t", "attention": "sdpa", "vanilla": True, "mfu": 0.50},
        {"shape": "t", "attention": "sdpa", "vanilla": False, "mfu": 0.46},
    ]
    assert [v["met"] for v in mfu_targets(rows)] == [True, False]


# ---------------------------------------------------------------------------------------------------- stability
def _run(arch: str, lr: float, loss: float, plateau: bool = False) -> dict:
    return {"arch": arch, "lr": lr, "final_loss": loss, "plateau": plateau}


def test_stability_checks_pass_only_when_hires_learns_wherever_the_control_does():
    from benchmarks.stability import acceptance

    good = [_run("control", 1e-3, 5.0), _run("control", 3e-3, 4.8), _run("hires", 1e-3, 4.9), _run("hires", 3e-3, 4.7)]
    assert [ok for _, ok, _ in acceptance(good)] == [True, True, True]  # the control is the default baseline
    stuck = [*good[:3], _run("hires", 3e-3, 6.7, plateau=True)]
    verdicts = acceptance(stuck)
    assert [ok for _, ok, _ in verdicts] == [False, False, False]
    assert "HiRes on the plateau at 0.003" in verdicts[0][2]


def test_stability_check_one_fails_when_the_baseline_learns_at_no_rate():
    """A grid where the baseline never leaves the plateau says nothing about HiRes: check 1 must not pass."""
    from benchmarks.stability import acceptance

    stuck = [_run("control", 1e-3, 6.6, plateau=True), _run("control", 3e-3, 6.7, plateau=True)]
    _, ok, numbers = acceptance([*stuck, _run("hires", 1e-3, 5.0)])[0]
    assert not ok and "no rate learns" in numbers


def test_stability_check_three_takes_each_best_over_its_own_rates():
    """The control's best at a rate HiRes never ran still counts: best against best, each over its own grid."""
    from benchmarks.stability import acceptance

    runs = [
        _run("hires", 1e-3, 4.9),
        _run("hires", 2e-3, 4.7),
        _run("hires", 4e-3, 4.8),
        _run("control", 2e-3, 4.75),
        _run("control", 8e-3, 4.6),  # HiRes did not run here
    ]
    verdicts = acceptance(runs)
    assert not verdicts[2][1]
    assert "HiRes 4.700 at 0.002 vs the control 4.600 at 0.008; the control's best: high edge" in verdicts[2][2]
    assert not verdicts[1][1] and "HiRes did not run at 0.008" in verdicts[1][2]


def test_stability_checks_the_control_first_and_never_calls_it_a_twin():
    """One name a baseline: `control` (the Llama twin with HiRes's embedding scale), `plain-twin` (as it ships)."""
    from benchmarks.stability import acceptance, checks_lines

    runs = [_run("plain-twin", 3e-3, 6.2), _run("control", 3e-3, 4.6), _run("hires", 3e-3, 4.7)]
    assert acceptance(runs, baseline="plain-twin")[2][1] and not acceptance(runs)[2][1]
    text = "\n".join(checks_lines(runs))
    control, _ = text.split("against the plain twin")
    assert "the control's best" in control and "twin" not in control


def test_stability_arms_vary_the_stream_width_and_the_block_size():
    from types import SimpleNamespace

    from benchmarks.stability import VARIANTS
    from hires_hf.experiments.harness import Shape

    shape = Shape(hidden_size=64, num_hidden_layers=8, layers_per_block=4)
    data = SimpleNamespace(special={}, context=32)  # what a config needs of the data: token ids and context
    widths = {name: VARIANTS[name].config(shape, data) for name in ("hires", "hires-D=d", "hires-D=4d", "hires-k2")}
    assert [c.residual_size for c in widths.values()] == [128, 64, 256, 128]
    assert widths["hires-k2"].layers_per_block == 2 and widths["hires"].layers_per_block == 4
    assert VARIANTS["control"].config(shape, data).model_type == "llama"


@pytest.mark.slow
def test_stability_smoke_writes_table_json_and_figure(tmp_path):
    from benchmarks.stability import main as stability

    assert stability(["--smoke", "--out-dir", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "stability.json").read_text())
    assert {(r["arch"], r["lr"]) for r in payload["runs"]} == {
        (arch, lr) for arch in ("control", "plain-twin", "hires", "hires-old-default") for lr in (1e-3, 3e-3)
    }
    steps = {r["arch"]: r["steps"] for r in payload["runs"]}
    assert steps["control"] == steps["plain-twin"] == 6  # --vanilla-steps of the smoke preset, exactly
    assert steps["hires"] < steps["control"]  # equal counted FLOPs: HiRes pays for its projections with steps
    assert all(r["diagnostics"] and r["diagnostics"][0]["units"] for r in payload["runs"])
    text = (tmp_path / "stability.md").read_text()
    assert "| peak lr | control | plain twin | hires | hires-old-default |" in text
    assert text.index("Checks of `hires` against the control") < text.index("against the plain twin")
    assert (tmp_path / "stability.png").stat().st_size > 10_000
    # Another seed is another run (weights and batch order), written next to the first rather than over it.
    seed1 = ["--smoke", "--seed", "1", "--archs", "plain-twin", "hires", "--lrs", "1e-3", "--out-dir", str(tmp_path)]
    assert stability(seed1) == 0
    reseeded = json.loads((tmp_path / "stability_seed1.json").read_text())["runs"]
    first = {(r["arch"], r["lr"]): r["final_loss"] for r in payload["runs"]}
    assert [(r["arch"], r["lr"]) for r in reseeded] == [("plain-twin", 1e-3), ("hires", 1e-3)]
    assert reseeded[1]["final_loss"] != pytest.approx(first["hires", 1e-3], abs=1e-6)
    with pytest.raises(SystemExit):  # one name a baseline: `vanilla` is no architecture (control / plain-twin)
        stability(["--smoke", "--archs", "vanilla", "--out-dir", str(tmp_path)])


@pytest.mark.slow
def test_stability_over_seeds_averages_the_cells_every_seed_ran(tmp_path):
    from benchmarks.stability import main as stability

    assert stability(["--smoke", "--archs", "plain-twin", "hires", "--lrs", "1e-3", "--out-dir", str(tmp_path)]) == 0
    assert (
        stability(
            [
                "--smoke",
                "--seed",
                "1",
                "--archs",
                "plain-twin",
                "hires",
                "--lrs",
                "1e-3",
                "3e-3",
                "--out-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    grids = [tmp_path / "stability.json", tmp_path / "stability_seed1.json"]
    assert stability(["--over-seeds", *map(str, grids)]) == 0
    losses = {
        (r["arch"], r["lr"], p["settings"]["seed"]): r["final_loss"]
        for p in map(json.loads, (g.read_text() for g in grids))
        for r in p["runs"]
    }
    table = (tmp_path / "stability_seeds.md").read_text()
    mean = (losses["hires", 1e-3, 0] + losses["hires", 1e-3, 1]) / 2
    assert f"→ {mean:.3f}" in table  # the mean of the two seeds
    assert f"HiRes {mean:.3f} at 0.001" in table  # checks run on means, over rates every seed has (not 3e-3)
    assert (tmp_path / "stability_seeds.png").stat().st_size > 10_000
    with pytest.raises(SystemExit, match="no grid at"):
        stability(["--over-seeds", str(tmp_path / "absent.json")])


@pytest.mark.slow
def test_stability_extend_runs_only_the_missing_cells_of_the_same_experiment(tmp_path):
    from benchmarks.stability import main as stability

    out = ["--smoke", "--archs", "plain-twin", "--out-dir", str(tmp_path)]
    assert stability([*out, "--lrs", "1e-3"]) == 0
    first = json.loads((tmp_path / "stability.json").read_text())["runs"]
    assert stability([*out, "--extend", "--lrs", "1e-3", "3e-3"]) == 0
    runs = json.loads((tmp_path / "stability.json").read_text())["runs"]
    assert [(r["arch"], r["lr"]) for r in runs] == [("plain-twin", 1e-3), ("plain-twin", 3e-3)]
    assert runs[0] == first[0]  # kept, not re-run
    with pytest.raises(SystemExit, match="differs in vanilla_steps"):
        stability([*out, "--extend", "--lrs", "5e-3", "--vanilla-steps", "3"])


def test_cpu_throughput_counts_flops_of_the_trained_model_and_says_when_compile_pays(tmp_path):
    """One cell measured in-process: counted TFLOP/s is tokens/s times the accounting's FLOPs per token; the
    compile's break-even is its warm-up over the time it saves per FLOP."""
    from benchmarks import cpu_throughput
    from hires_hf.accounting import train_flops_per_token
    from hires_hf.experiments.harness import Shape

    cell = cpu_throughput.measure("hires", 32, "bf16", threads=1, steps=1, batch=2, context=32)
    config = Shape(hidden_size=32, num_hidden_layers=8).config({"pad_token_id": 0}, 32)
    expected = cell["tokens_per_second"] * train_flops_per_token(config, 32) / 1e12
    assert cell["tflops"] == pytest.approx(expected, rel=1e-6) and cell["second_model_warmup_seconds"] is None
    eager, compiled = {"tflops": 0.1}, {"tflops": 0.2, "warmup_seconds": 30.0}
    assert cpu_throughput.break_even_flops(eager, compiled) == pytest.approx(30.0 / (1 / 0.1e12 - 1 / 0.2e12))
    assert cpu_throughput.break_even_flops(compiled | {"warmup_seconds": 1.0}, eager | {"warmup_seconds": 1.0}) is None


def test_cpu_throughput_says_which_precision_and_compile_pay_on_a_cpu_without_bf16_units():
    """Where bf16 is emulated (5x slower here, made up), the report shows it, and fp32's compile gets its line."""
    from benchmarks import cpu_throughput

    speeds = {"fp32": 0.1, "fp32+compile": 0.15, "bf16": 0.02}
    rows = [
        {"width": 64, "arm": "hires", "layout": "2 processes", "precision": precision, "tflops": tflops}
        | {"warmup_seconds": 10.0}
        for precision, tflops in speeds.items()
    ]
    (line,) = cpu_throughput.compile_lines({"rows": rows})  # no bf16+compile cell: no bf16 line
    assert "compile x1.50 over fp32 eager; repays itself from 3e+12 counted FLOPs" in line
    assert cpu_throughput.precision_lines({"rows": rows}) == ["- 64x8, 2 processes: bf16 x0.20 the speed of fp32"]
