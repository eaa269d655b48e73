"""The rung-2 stall watch (`benchmarks/ladder_stall.py`): its bigram reference and what it records per case."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from benchmarks import ladder_stall

VOCAB = 50


def blocks_where(next_token, count: int = 400, length: int = 64) -> torch.Tensor:
    """`count` blocks whose tokens follow `next_token(before, current, generator)` from two random tokens."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(count):
        row = torch.randint(VOCAB, (2,), generator=generator).tolist()
        while len(row) < length:
            row.append(next_token(row[-2], row[-1], generator))
        rows.append(row)
    return torch.tensor(rows)


def test_the_bigram_loss_is_what_the_current_token_alone_predicts():
    follows = blocks_where(lambda _, current, __: (current + 1) % VOCAB)
    noise = blocks_where(lambda _, __, g: int(torch.randint(VOCAB, (1,), generator=g)))
    assert ladder_stall.bigram_loss(SimpleNamespace(train=follows), follows[:20]) < 0.2  # each first pair is random
    loss = ladder_stall.bigram_loss(SimpleNamespace(train=noise), noise[:20])
    assert abs(loss - math.log(VOCAB)) < 0.15, loss


def test_the_watch_records_loss_attention_and_the_stream_for_each_case(tmp_path):
    out = tmp_path / "stall"
    common = ["--smoke", "--steps", "6", "--every", "3", "--out-dir", str(out)]
    assert ladder_stall.main([*common, "--cases", "hires:1e-2"]) == 0
    assert ladder_stall.main([*common, "--cases", "control:1e-2"]) == 0  # a later call adds its cases to the table
    payload = json.loads((out / "stall.json").read_text())
    assert (out / "stall.png").stat().st_size > 0 and "| hires lr=0.01 |" in (out / "stall.md").read_text()
    hires, control = payload["cases"]
    assert [row["step"] for row in hires["rows"]] == [1, 4, 6]  # every third step from the first, and the last
    for case in (hires, control):
        for row in case["rows"]:
            assert math.isfinite(row["loss"]) and len(row["attention_entropy"]) == 4  # the smoke shapes' 4 layers
            for share in ("attention_entropy", "attention_on_self", "attention_on_previous", "attention_on_first"):
                assert all(0.0 <= value <= 1.0 + 1e-6 for value in row[share]), share
    assert all(unit["write_to_stream"] > 0 for row in hires["rows"] for unit in row["units"])
    assert not any("write_to_stream" in unit for row in control["rows"] for unit in row["units"])
    assert payload["bigram_loss"] < payload["unigram_loss"]
    assert hires["final_loss"] is None  # stopped before its end: no validation loss to compare with the ladder's


def test_a_case_trained_to_its_end_has_the_ladders_validation_loss(tmp_path):
    out = tmp_path / "stall"
    assert ladder_stall.main(["--smoke", "--cases", "control:1e-2", "--steps", "1000", "--out-dir", str(out)]) == 0
    case = json.loads((out / "stall.json").read_text())["cases"][0]
    assert case["steps"] == case["of_steps"] == case["rows"][-1]["step"]  # trained to the run's own end
    assert math.isfinite(case["final_loss"]) and f"{case['final_loss']:.4f}" in (out / "stall.md").read_text()


def test_a_case_that_is_not_arm_colon_rate_or_names_no_arm_is_refused_in_one_line(capsys):
    for case in ("hires", "hires:fast", "hires:-1e-2", "hires-v2:1e-2"):
        with pytest.raises(SystemExit) as stop:
            ladder_stall.main(["--smoke", "--cases", case])
        assert stop.value.code == 2
        assert "error:" in capsys.readouterr().err
