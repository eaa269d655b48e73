"""Diagnostics users run on their own models and runs: probes, the Trainer callback, `hires-hf inspect`."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

from hires_hf import HiResConfig
from hires_hf.cli import main
from hires_hf.diagnostics import (
    COLLAPSED_ENTROPY,
    DiagnosticsCallback,
    DiagnosticsRecorder,
    attention_collapsed,
    attention_entropy,
    group_update_ratios,
    param_group,
    projection_spectra,
    shared_fraction,
    stream_probe,
)
from hires_hf.diagnostics.probes import snapshot
from hires_hf.twins import vanilla_config


def test_shared_fraction_is_one_for_identical_tokens_and_zero_for_centred_ones():
    same = torch.randn(1, 1, 16).expand(2, 8, 16)
    centred = torch.randn(2, 8, 16)
    centred = centred - centred.reshape(-1, 16).mean(0)
    assert shared_fraction(same) == pytest.approx(1.0)
    assert shared_fraction(centred) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("model.embed_tokens.weight", "embed"),
        ("model.blocks.1.read_proj.weight", "read"),
        ("model.blocks.1.write_proj.weight", "write"),
        ("model.blocks.0.outer_norm.weight", "outer_norm"),
        ("model.read_out.weight", "read_out"),
        ("model.blocks.0.write_norm.weight", "norm"),
        ("model.layers.1.self_attn.q_proj.weight", "attn"),
        ("model.layers.3.mlp.down_proj.weight", "mlp"),
        ("model.layers.3.input_layernorm.weight", "norm"),
        ("lm_head.weight", "head"),
    ],
)
def test_parameters_fall_into_the_groups_reports_use(name, group):
    assert param_group(name) == group


def test_probe_measures_each_block_of_hires_and_each_layer_of_its_twin():
    config = HiResConfig.from_preset("tiny")
    ids = torch.randint(0, config.vocab_size, (2, 16))
    hires = stream_probe(AutoModelForCausalLM.from_config(config), ids)
    assert hires["kind"] == "block" and [u["block"] for u in hires["units"]] == [0, 1]
    for unit in hires["units"]:
        assert unit["write_to_stream"] == pytest.approx(unit["write_rms"] / unit["stream_rms"])
    assert hires["units"][1]["stream_rms"] == pytest.approx(1.0, rel=0.05)  # after an outer norm with unit gain
    twin = stream_probe(AutoModelForCausalLM.from_config(vanilla_config(config)), ids)
    assert twin["kind"] == "layer" and len(twin["units"]) == config.num_hidden_layers


def test_attention_entropy_is_uniform_at_initialisation_and_leaves_the_backend_as_it_was():
    model = AutoModelForCausalLM.from_config(HiResConfig.from_preset("tiny"), attn_implementation="sdpa")
    with torch.no_grad():  # zero queries and keys: every query attends uniformly to its context
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.zero_()
    entropy = attention_entropy(model, torch.randint(0, 512, (2, 16)))
    assert entropy == pytest.approx([1.0] * 4, abs=1e-4)
    assert model.config._attn_implementation == "sdpa"


def test_spectra_and_update_ratios_follow_the_weights():
    model = AutoModelForCausalLM.from_config(HiResConfig.from_preset("tiny"))
    spectra = projection_spectra(model)
    assert set(spectra) == {"read.0", "write.0", "read.1", "write.1", "read_out"}
    weight = model.model.blocks[0].write_proj.weight
    assert spectra["write.0"][0] == pytest.approx(torch.linalg.matrix_norm(weight, ord=2).item(), rel=1e-5)
    other = model.model.blocks[1].write_proj.weight
    expected = 0.5 * weight.norm() / (weight.norm() ** 2 + other.norm() ** 2).sqrt()
    before = snapshot(model.named_parameters())
    with torch.no_grad():
        weight.mul_(1.5)  # one of the two write matrices moves by half its norm, nothing else moves
    ratios = group_update_ratios(before, model.named_parameters())
    assert ratios["write"] == pytest.approx(expected.item(), rel=1e-4)
    assert ratios["read"] == 0.0 and ratios["embed"] == 0.0


@pytest.fixture(scope="module")
def diagnosed_run(tmp_path_factory):
    """A few Trainer steps of a tiny HiRes with the callback, then saved as a folder."""
    out = tmp_path_factory.mktemp("run")
    config = HiResConfig.from_preset("tiny")
    model = AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, config.vocab_size, (16, 32))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(
        output_dir=str(out), max_steps=5, per_device_train_batch_size=4, learning_rate=3e-3, report_to="none",
        use_cpu=True, save_strategy="no", disable_tqdm=True, logging_strategy="no",
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=dataset, callbacks=[DiagnosticsCallback(ids[:2], every=2)]).train()
    model.save_pretrained(out / "model")
    return out


def test_trainer_callback_writes_a_row_every_few_optimizer_steps(diagnosed_run):
    rows = [json.loads(line) for line in (diagnosed_run / "diagnostics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 2, 4]
    for row in rows:
        assert {"embed", "read", "write", "read_out", "attn", "mlp", "head"} <= set(row["update_ratio"])
        assert all(value > 0 for value in row["grad_norm"].values())
        assert len(row["units"]) == 2 and len(row["attention_entropy"]) == 4


def test_inspect_plots_a_run_and_probes_a_model_folder(diagnosed_run, capsys):
    assert main(["inspect", str(diagnosed_run)]) == 0
    assert "| step | final shared |" in capsys.readouterr().out
    assert (diagnosed_run / "diagnostics.png").stat().st_size > 10_000
    folder = diagnosed_run / "model"
    files = sorted(path.name for path in folder.iterdir())
    assert main(["inspect", str(folder), "--seq-len", "16", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "| block | stream RMS |" in out and "top singular values read_out" in out
    assert sorted(path.name for path in folder.iterdir()) == files  # nothing lands in the model (publish uploads it)
    beside = diagnosed_run / "model-inspect"
    probe = json.loads((beside / "inspect.json").read_text())
    assert len(probe["units"]) == 2 and (beside / "inspect.png").is_file()


def test_inspect_of_something_else_is_one_line(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "neither a diagnostics.jsonl" in err and len(err.splitlines()) == 1


def _sharpened(scale: float) -> torch.nn.Module:
    """A tiny HiRes whose queries and keys are `scale` times larger: large scales make every head look at one token."""
    model = AutoModelForCausalLM.from_config(HiResConfig.from_preset("tiny"))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(scale)
            layer.self_attn.k_proj.weight.mul_(scale)
    return model


def test_a_recorder_warns_once_when_every_layer_has_collapsed_and_inspect_says_what_to_change(tmp_path, caplog, capsys):
    ids = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    healthy, collapsed = _sharpened(1.0), _sharpened(40.0)
    assert not attention_collapsed(attention_entropy(healthy, ids))
    assert max(attention_entropy(collapsed, ids)) < COLLAPSED_ENTROPY
    # one sharp layer is a previous-token head, not the stall
    assert not attention_collapsed([0.01, 0.02, 0.5]) and attention_collapsed([0.01, 0.02, 0.1])

    for model, path in ((healthy, tmp_path / "healthy"), (collapsed, tmp_path / "collapsed")):
        recorder = DiagnosticsRecorder(ids, every=1, path=path / "diagnostics.jsonl")
        with caplog.at_level("WARNING", logger="hires_hf.diagnostics.recorder"):
            for step in range(3):
                recorder.before_step(model, step)
                recorder.after_step(model, step)
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("Step 0: the attention has collapsed")
    assert "learning rate" in warnings[0]

    assert main(["inspect", str(tmp_path / "healthy")]) == 0
    assert "collapsed" not in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "collapsed")]) == 0
    assert "From step 0: the attention has collapsed" in capsys.readouterr().out
    collapsed.save_pretrained(tmp_path / "model")
    assert main(["inspect", str(tmp_path / "model"), "--seq-len", "32", "--batch", "2"]) == 0
    assert "The attention has collapsed" in capsys.readouterr().out
