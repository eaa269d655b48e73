"""The copying probe (`benchmarks/induction_probe.py`): it measures in-context copying and nothing else, and a
probed run is the ladder's run, step for step."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from types import SimpleNamespace

import torch
from torch import nn

from benchmarks import induction_probe
from hires_hf.commands.ladder import cache_dir
from hires_hf.experiments.ladder import LadderSettings, cell_plan, open_ladder, train_cell

CELL = ("hires", "32x4", 1e-2)
SMOKE = ["--smoke", "--quiet", "--arm", "hires", "--rung", "32x4", "--lr", "1e-2"]


class Copier(nn.Module):
    """Predicts each token of a sequence's second half from the first half's token after the same position, as an
    induction head does; uniform everywhere else."""

    def __init__(self, vocab: int, copies: bool) -> None:
        super().__init__()
        self.vocab, self.copies = vocab, copies

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        batch, length = input_ids.shape
        logits = torch.zeros(batch, length, self.vocab)
        half = length // 2
        if self.copies:
            for t in range(half, length - 1):  # position t predicts token t + 1 = first-half token t + 1 - half
                logits[torch.arange(batch), t, input_ids[:, t + 1 - half]] = 20.0
        return SimpleNamespace(logits=logits)


def test_the_probe_credits_copying_and_only_copying():
    vocab = 50
    sequences = induction_probe.repeated_sequences(torch.randint(vocab, (8, 16)), count=4, half=10)
    assert torch.equal(sequences[:, :10], sequences[:, 10:])
    first, second = induction_probe.copy_losses(Copier(vocab, copies=True), sequences, "fp32")
    assert math.isclose(first, math.log(vocab), rel_tol=1e-5)  # nothing to copy from in the first copy
    assert second < 1e-3  # every token after the second copy's first is predicted
    first, second = induction_probe.copy_losses(Copier(vocab, copies=False), sequences, "fp32")
    assert math.isclose(first, second, rel_tol=1e-5)  # a model that does not copy gains nothing


class Circuit(nn.Module):
    """Two layers of one-hot attention: layer 0 a previous-token head, layer 1 an induction head over a sequence
    and its repeat; the other head of each layer attends to the first token. Asks for eager attention as a
    transformers model does."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(_attn_implementation="sdpa")
        self.asked: list[str] = []

    def set_attn_implementation(self, implementation: str) -> None:
        self.asked.append(implementation)
        self.config._attn_implementation = implementation

    def forward(self, input_ids: torch.Tensor, output_attentions: bool) -> SimpleNamespace:
        assert output_attentions and self.config._attn_implementation == "eager"
        batch, length = input_ids.shape
        half = length // 2
        previous, induction = torch.zeros(2, batch, 2, length, length)
        previous[:, :, :, 0] = induction[:, :, :, 0] = 1.0  # position 0 and the idle heads look at the first token
        for t in range(1, length):
            previous[:, 0, t] = torch.nn.functional.one_hot(torch.tensor(t - 1), length)
        for t in range(half, length):
            induction[:, 0, t] = torch.nn.functional.one_hot(torch.tensor(t - half + 1), length)
        return SimpleNamespace(attentions=(previous, induction))


def test_the_head_scores_find_the_previous_token_head_and_the_induction_head_in_their_layers():
    sequences = induction_probe.repeated_sequences(torch.randint(50, (8, 16)), count=3, half=12)
    model = Circuit().train()
    scores = induction_probe.head_scores(model, sequences)
    assert scores["previous"][0] == 1.0 and scores["induction"][1] == 1.0
    assert scores["induction"][0] < 0.1 and scores["previous"][1] < 0.1  # each head scores only its own pattern
    assert model.asked == ["eager", "sdpa"] and model.training  # the model trains on as it was set


def probe_row(step: int, gain: float, induction: dict[int, float], previous: dict[int, float]) -> dict:
    return {
        "step": step,
        "gain": gain,
        "induction": [induction.get(layer, 0.0) for layer in range(12)],
        "previous": [previous.get(layer, 0.0) for layer in range(12)],
    }


def test_the_circuit_is_read_where_copying_starts_and_only_from_heads_it_can_compose_with():
    """HiRes seed 1 at rung 1 copied from step 900 with its previous-token head (layer 6) and induction head (layer
    7) in one block; seed 2's strongest previous-token head sat in the last layer, after every induction head."""
    early = [probe_row(850, 0.6, {7: 0.15}, {6: 0.8}), probe_row(900, 1.1, {7: 0.28}, {6: 0.91, 10: 0.5})]
    case = {"arm": "hires", "rung": "64x12", "probes": [*early, probe_row(950, 1.5, {7: 0.35}, {6: 0.93})]}
    assert induction_probe.circuit(case) == "indu. L7 0.28 @900 ← prev. L6 0.91 (≥ 0.5 from 850), one block"
    late = [probe_row(1600, 0.4, {8: 0.05}, {3: 0.6, 11: 0.9})]  # no onset: the last probe, layer 11 ignored
    crossing = "indu. L8 0.05 @1,600 ← prev. L3 0.60 (≥ 0.5 from 1,600), across blocks"
    assert induction_probe.circuit({**case, "probes": late}) == crossing
    vanilla = induction_probe.circuit({**case, "arm": "control"})
    assert vanilla.endswith("prev. L6 0.91 (≥ 0.5 from 850)")  # a vanilla has no blocks
    assert induction_probe.circuit({**case, "arm": "k=6", "probes": late}).endswith("across blocks")  # 0-5, 6-11
    assert induction_probe.circuit({**case, "arm": "k=6"}).endswith("one block")  # layers 6 and 7: block 1 of six


def test_a_probed_run_is_the_ladders_run_and_a_stopped_one_keeps_its_probes(tmp_path):
    ladder_dir, out = tmp_path / "ladder", tmp_path / "out"
    ladder = open_ladder(LadderSettings.smoke(), ladder_dir, cache_dir(), progress=False)
    plan = cell_plan(ladder, *CELL, 0)
    own = train_cell(ladder, plan, progress=False)
    common = [*SMOKE, "--ladder-dir", str(ladder_dir), "--out-dir", str(out), "--every", "2"]
    assert induction_probe.main([*common, "--seeds", "0", "--until", str(10**6)]) == 0
    (case,) = json.loads((out / "induction_probe.json").read_text())["cases"]
    assert case["final_loss"] == own.final_loss  # probing does not move the run by a bit
    (kept,) = induction_probe.stored_cases(out)  # the probe keeps the trace: the ladder does only from a checkpoint
    trace = induction_probe.own_trace(kept)
    assert [step for step, _ in trace] == list(range(1, plan.settings.steps + 1)) and math.isfinite(trace[-1][1])
    assert [row["step"] for row in case["probes"]] == list(range(2, plan.settings.steps + 1, 2))
    layers = plan.shape.num_hidden_layers
    assert all(len(row["induction"]) == len(row["previous"]) == layers for row in case["probes"])
    assert (out / "induction_heads.png").stat().st_size > 0
    assert (out / "induction_probe.png").stat().st_size > 0
    assert f"{own.final_loss:.3f}" in (out / "induction_probe.md").read_text()

    stored = next((out / "cases").glob("*.json"))
    before = stored.stat().st_mtime_ns
    assert induction_probe.main([*common, "--seeds", "0"]) == 0  # a stored case is not trained again
    assert stored.stat().st_mtime_ns == before

    stop = plan.settings.steps // 2
    assert induction_probe.main([*common, "--seeds", "1", "--until", str(stop)]) == 0
    cases = {c["seed"]: c for c in json.loads((out / "induction_probe.json").read_text())["cases"]}
    assert cases[1]["final_loss"] is None and cases[1]["probes"][-1]["step"] <= stop
    assert not list((out / "checkpoints").iterdir())  # nothing of a finished case is left behind

    further = ["--seeds", "1", "--until", str(plan.settings.steps), "--marks", "20"]
    assert induction_probe.main([*common, *further]) == 0
    longer = {c["seed"]: c for c in json.loads((out / "induction_probe.json").read_text())["cases"]}[1]
    assert longer["final_loss"] is not None and longer["probes"][: len(cases[1]["probes"])] == cases[1]["probes"]
    row = next(line for line in (out / "induction_probe.md").read_text().splitlines() if "seed 1 |" in line)
    mark, final = (cell.strip() for cell in row.strip("|").split("|")[-2:])
    assert mark and final == f"{longer['final_loss']:.3f}"  # a run the ladder never trained reports its own losses


def test_a_run_stopped_early_keeps_its_training_loss_as_far_as_its_last_checkpoint(tmp_path, monkeypatch):
    """A probe stopped before its run's end (a circuit's onset is all it asks) keeps the training loss its last
    checkpoint carried, so that its report row has loss columns: before, such a run kept none."""
    real = LadderSettings.smoke
    every_step = staticmethod(lambda **fields: replace(real(**fields), checkpoint_seconds=1e-9))
    monkeypatch.setattr(induction_probe.LadderSettings, "smoke", every_step)
    ladder_dir, out = tmp_path / "ladder", tmp_path / "out"
    ladder = open_ladder(LadderSettings.smoke(), ladder_dir, cache_dir(), progress=False)
    stop = cell_plan(ladder, *CELL, 0).settings.steps // 2
    common = [*SMOKE, "--ladder-dir", str(ladder_dir), "--out-dir", str(out), "--every", "2"]
    assert induction_probe.main([*common, "--seeds", "0", "--until", str(stop)]) == 0
    (case,) = induction_probe.stored_cases(out)
    assert case["final_loss"] is None  # stopped early: no final loss
    trace = induction_probe.own_trace(case)
    assert [step for step, _ in trace] == list(range(1, stop + 1)) and all(math.isfinite(x) for _, x in trace)
    assert not list((out / "checkpoints").iterdir())  # the checkpoint read, then removed


def test_the_plateau_exit_is_where_the_smoothed_training_loss_first_reaches_the_line():
    window = induction_probe.EXIT_WINDOW
    # 3.3 nats on the plateau until step 1,000, 2.75 from 1,001: the mean of the last `window` steps reaches 3.0
    # once 0.3 / 0.55 of them are past the drop.
    trace = [(step, 3.3 if step <= 1000 else 2.75) for step in range(1, 2001)]
    assert induction_probe.plateau_exit(trace) == 1000 + math.ceil(window * 0.3 / 0.55)
    assert induction_probe.plateau_exit([(step, 3.3) for step in range(1, 2001)]) is None  # never left
    assert induction_probe.plateau_exit(None) is None  # a run trained before traces were kept


def test_only_seeds_of_one_cell_are_compared_on_when_they_left():
    def row(arm, lr, seed, exit_step, final):
        return {"rung": "64x12", "arm": arm, "lr": lr, "seed": seed, "exit": exit_step, "final": final}

    rows = [
        row("hires", 8e-3, 0, 900, 2.80),
        row("hires", 8e-3, 1, 1300, 2.95),  # later and worse
        row("hires", 8e-3, 2, 1100, 3.00),  # later than seed 0 and worse; earlier than seed 1 and worse
        row("hires", 8e-3, 3, None, 3.10),  # no exit: not compared
        row("hires", 1.6e-2, 0, 2000, 2.50),  # another rate: another cell
        row("control", 8e-3, 0, 100, 3.50),  # another arm: another cell
    ]
    assert induction_probe.later_exit_worse(rows) == (2, 3)


def test_exits_are_read_from_a_ladders_report_and_traces_alone(tmp_path, capsys):
    (tmp_path / "runs" / "traces").mkdir(parents=True)
    exits = {"k0": 900, "k1": 1300}  # the step each run's loss drops from the plateau to well under the line
    for key, drop in exits.items():
        loss = [3.3 if step <= drop else 2.5 for step in range(1, 2001)]
        trace = {"key": key, "first_step": 1, "loss": loss}
        (tmp_path / "runs" / "traces" / f"{key}.json").write_text(json.dumps(trace))
    cell = {"best_lr": 8e-3, "seed_ids": [0, 1, 2], "keys": ["k0", "k1", "k2"], "seed_losses": [2.8, 2.9, 2.85]}
    (tmp_path / "summary.json").write_text(json.dumps({"rungs": [{"shape": "64x12", "arms": {"hires": cell}}]}))

    assert induction_probe.main(["--exits", str(tmp_path)]) == 0
    report = (tmp_path / "plateau_exits.md").read_text()
    assert "s0 919 → 2.800; s1 1,319 → 2.900; s2 no trace → 2.850" in report  # 0.3 / 0.8 of 50 steps past the drop
    assert "| 1 of 1 |" in report  # the later seed ended worse
    assert (tmp_path / "plateau_exits.png").is_file()


def test_exits_of_a_folder_without_a_ladder_report_fail_in_one_line_and_write_nothing(tmp_path, capsys):
    assert induction_probe.main(["--exits", str(tmp_path)]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_the_exit_orders_p_value_is_small_only_when_later_leavers_end_worse():
    def cell(finals):
        return [
            {"rung": "96x12", "arm": "hires", "lr": 8e-3, "seed": i, "exit": 800 + 100 * i, "final": final}
            for i, final in enumerate(finals)
        ]

    in_order = cell([2.60, 2.61, 2.62, 2.63, 2.64])  # only 1 of the 120 orders of five seeds is this one
    assert induction_probe.chance_of_as_many(in_order, draws=2000) < 0.02
    assert induction_probe.chance_of_as_many(cell([2.64, 2.63, 2.62, 2.61, 2.60]), draws=2000) > 0.98


def test_the_cost_of_a_late_exit_is_the_slope_of_final_loss_on_exit_with_an_interval_that_holds_it():
    def cell(exits, finals):
        return [{"exit": e, "final": f} for e, f in zip(exits, finals, strict=True)]

    exits = [800, 900, 1000, 1100, 1200, None]  # the untimed seed is left out of the fit
    wobble = [0.01, -0.01, 0.0, -0.01, 0.01, 0.0]
    # 0.03 nats per 100 steps, plus a wobble that is not a line
    finals = [2.60 + 0.0003 * ((e or 800) - 800) + w for e, w in zip(exits, wobble, strict=True)]
    slope, half_width, df = induction_probe.delay_cost(cell(exits, finals))
    assert df == 3
    assert math.isclose(slope, 0.03, abs_tol=1e-9)  # the wobble is symmetric about the line: it moves no slope
    assert 0 < half_width < 0.03  # a real cost is told from none
    assert induction_probe.delay_cost(cell([800, 900, 1000], [2.6, 2.7, 2.8])) is None  # too few seeds to say
    level = induction_probe.delay_cost(cell([800, 900, 1000, 1100], [2.61, 2.59, 2.61, 2.59]))
    assert abs(level[0]) < level[1]  # exit and end unrelated: the interval holds zero


def test_a_run_in_flight_is_read_from_its_checkpoint_and_predicted_from_its_cells_exit_line(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "runs" / "traces").mkdir(parents=True)
    (tmp_path / "runs" / "checkpoints").mkdir()

    def losses(drop, steps):
        return [3.3 if step <= drop else 2.5 for step in range(1, steps + 1)]

    drops = [800, 900, 1000, 1100]  # finished seeds: 0.1 nats a 100 steps later, exactly on a line
    for seed, drop in enumerate(drops):
        trace = {"key": f"k{seed}", "first_step": 1, "loss": losses(drop, 2000)}
        (tmp_path / "runs" / "traces" / f"k{seed}.json").write_text(json.dumps(trace))
    finals = [2.6 + 0.001 * (drop - 800) for drop in drops]
    cell = {"best_lr": 8e-3, "seed_ids": [0, 1, 2, 3], "keys": ["k0", "k1", "k2", "k3"], "seed_losses": finals}
    flying = [
        {"shape": "96x12", "arm": "hires", "lr": 8e-3, "seed": 4, "steps": 3000, "key": "k4"},  # left at 1,200
        {"shape": "96x12", "arm": "hires", "lr": 8e-3, "seed": 5, "steps": 3000, "key": "k5"},  # still on the plateau
        {"shape": "96x12", "arm": "hires", "lr": 8e-3, "seed": 6, "steps": 3000, "key": "k6"},  # ended since
    ]
    for key, drop, steps in (("k4", 1200, 1500), ("k5", 5000, 700)):
        progress = {"step": steps, "train_losses": [[s, x] for s, x in enumerate(losses(drop, steps), start=1)]}
        path = tmp_path / "runs" / "checkpoints" / f"{key}.safetensors"
        save_file({"weight": torch.zeros(1)}, str(path), metadata={"progress": json.dumps(progress)})
    summary = {"rungs": [{"shape": "96x12", "arms": {"hires": cell}}], "in_flight": flying}
    (tmp_path / "summary.json").write_text(json.dumps(summary))

    assert induction_probe.main(["--exits", str(tmp_path)]) == 0
    report = (tmp_path / "plateau_exits.md").read_text()
    late = 1200 + math.ceil(induction_probe.EXIT_WINDOW * 0.3 / 0.8)
    # the line through the finished seeds, extended to the late seed's exit; a seed exactly on it has no scatter
    assert f"| 4 | 1,500 of 3,000 | {late:,} | {2.6 + 0.001 * (late - 819):.3f} ± 0.000 (4 seeds) |" in report
    assert "| 5 | 700 of 3,000 | not yet (3.300 at step 700) |  |" in report
    assert "| 6 |" not in report  # its checkpoint is gone: it has ended, and the report will list it with its cell


def test_a_seed_is_on_time_when_it_leaves_no_later_than_every_vanilla_seed_at_its_rung():
    def row(rung, arm, seed, exit_step, final):
        return {
            "rung": rung,
            "baseline": "plain-twin",
            "arm": arm,
            "lr": 8e-3,
            "seed": seed,
            "exit": exit_step,
            "final": final,
        }

    rows = [
        row("96x12", "plain-twin", 0, 800, 2.60),
        row("96x12", "plain-twin", 1, None, 2.62),  # no trace: not a limit, still a baseline seed
        row("96x12", "control", 0, 900, 2.70),  # the latest vanilla exit sets the limit, whichever vanilla
        row("96x12", "hires", 0, 900, 2.59),  # at the limit: on time
        row("96x12", "hires", 1, 901, 2.65),
        row("96x12", "hires", 2, 1200, 2.67),
        row("96x12", "hires", 3, None, 2.50),  # untimed: in neither group
        row("64x12", "plain-twin", 0, None, 2.90),  # no timed vanilla at this rung: nothing to split on
        row("64x12", "hires", 0, 1000, 2.95),
        row("96x12", "D=4d", 0, None, 2.70),  # no timed seed: no row
    ]
    (split,) = induction_probe.on_time_split(rows)
    assert (split["rung"], split["arm"], split["limit"]) == ("96x12", "hires", 900)
    assert split["baseline"] == statistics.fmean([2.60, 2.62])
    assert split["on_time"] == (1, 2.59)
    assert split["late"][0] == 2 and math.isclose(split["late"][1], 2.66)
    table = induction_probe.split_table(rows)
    assert "| 96x12 | 900 | hires | 1: 2.590 (-0.020) | 2: 2.660 (+0.050) |" in table
