"""Evaluation: lm-eval on HiRes folders (our CLI and lm-eval's own), offline tasks, perplexity, scaling fits."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

from hires_hf import HiResConfig, HiResForCausalLM
from hires_hf.cli import main
from hires_hf.eval import harness
from hires_hf.eval.perplexity import sliding_window_perplexity, windows
from hires_hf.eval.scaling import Point, PowerLaw, analyse, fit_power_law, read_runs
from hires_hf.eval.tasks import generate
from hires_hf.stdlib_corpus import is_held_out
from hires_hf.training import build_tokenizer
from hires_hf.twins import vanilla_config

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CONTEXT = 256  # max_position_embeddings of the test model: an 8-line MC context fits, a perplexity doc does not


def _tokenizer() -> PreTrainedTokenizerFast:
    """The package's byte-level BPE trained on a few stdlib files: real merges, no download."""
    return build_tokenizer([(STDLIB / name).read_text() for name in ("textwrap.py", "string.py")], vocab_size=384)


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Off the near-uniform initial predictions, so that context (hence window placement) changes the numbers."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random HiRes folder with its tokenizer, its vanilla (Llama) twin, and a folder with no tokenizer."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = _tokenizer()
    config = HiResConfig.from_preset(
        "tiny",
        vocab_size=len(tokenizer),
        max_position_embeddings=CONTEXT,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    hires = _perturbed(HiResForCausalLM(config))
    twin = _perturbed(LlamaForCausalLM(vanilla_config(config)))
    paths = {"hires": root / "hires", "vanilla": root / "vanilla", "no_tokenizer": root / "no_tokenizer"}
    for name, model in (("hires", hires), ("vanilla", twin), ("no_tokenizer", hires)):
        model.save_pretrained(paths[name])
        if name != "no_tokenizer":
            tokenizer.save_pretrained(paths[name])
    return paths


# ---------------------------------------------------------------- offline task data


def test_shipped_task_data_is_small_and_well_formed() -> None:
    files = {name: generate.TASKS_DIR / name for name in (generate.NEXT_LINE_FILE, generate.PERPLEXITY_FILE)}
    assert sum(path.stat().st_size for path in files.values()) < 500_000
    rows = [json.loads(line) for line in files[generate.NEXT_LINE_FILE].read_text().splitlines()]
    assert 100 <= len(rows) <= 500
    for row in rows:
        assert len(set(row["choices"])) == 4 and row["context"].endswith("\n")
        assert 0 <= row["label"] < 4
    # Only held-out stdlib files: a model trained on the other 90% is tested on unseen code.
    assert all(is_held_out(row["source"].rsplit(":", 1)[0]) for row in rows)
    labels = [row["label"] for row in rows]  # spread over the 4 slots: always picking one slot does not win
    assert all(labels.count(slot) > len(labels) / 8 for slot in range(4))


def test_next_line_task_is_learnable_above_chance() -> None:
    """A few-line heuristic (indentation + names already in the context) beats 25%: the signal is there."""
    rows = [json.loads(line) for line in (generate.TASKS_DIR / generate.NEXT_LINE_FILE).read_text().splitlines()]

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip())

    correct = 0
    for row in rows:
        last = [line for line in row["context"].splitlines() if line.strip()][-1]
        expected = indent(last) + (4 if last.endswith(":") else 0)
        names = set(re.findall(r"[A-Za-z_]\w+", row["context"]))
        scores = [
            len(set(re.findall(r"[A-Za-z_]\w+", choice)) & names) - 0.1 * abs(indent(choice) - expected)
            for choice in row["choices"]
        ]
        correct += scores.index(max(scores)) == row["label"]
    assert correct / len(rows) > 0.4


def test_task_data_regenerates_deterministically(tmp_path: Path) -> None:
    counts = generate.generate(tmp_path)
    first = {name: (tmp_path / name).read_bytes() for name in counts}
    generate.generate(tmp_path)
    assert first == {name: (tmp_path / name).read_bytes() for name in counts}
    manifest = json.loads((generate.TASKS_DIR / generate.MANIFEST_FILE).read_text())
    if manifest["python"].rsplit(".", 1)[0] != ".".join(map(str, sys.version_info[:2])):
        pytest.skip(f"shipped data came from Python {manifest['python']}'s stdlib")
    for name in counts:
        assert first[name] == (generate.TASKS_DIR / name).read_bytes(), f"{name} differs from a regeneration"


# ---------------------------------------------------------------- hires-hf eval


@pytest.mark.slow
def test_eval_cli_compares_models_and_writes_json_and_table(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "results" / "eval.json"
    argv = ["eval", str(folders["hires"]), str(folders["vanilla"]), "--limit", "6", "--batch-size", "4"]
    assert main([*argv, "--bootstrap-iters", "10", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["models"]
    assert list(results) == [str(folders["hires"]), str(folders["vanilla"])]
    for model_results in results.values():
        next_line = model_results["results"]["stdlib_next_line"]
        assert 0 <= next_line["acc,none"] <= 1 and next_line["sample_len"] == 6
        assert model_results["results"]["stdlib_perplexity"]["bits_per_byte,none"] > 0
    table = out.with_suffix(".md").read_text()
    assert table.splitlines()[0] == "| task | metric | hires | stderr | vanilla | stderr |"
    assert "| stdlib_next_line | acc |" in table and "| stdlib_perplexity | bits_per_byte |" in table
    assert table.strip() in capsys.readouterr().out
    assert not list(out.parent.glob("*.tmp"))


def test_eval_prints_the_table_and_no_lm_eval_noise(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd, caplog
) -> None:
    """What lands on screen is the table: no warning about undeclared aggregations, no `--metadata` advice, no
    'model type is neither CausalLM nor Seq2SeqLM' guess, no git complaint outside a repository."""
    monkeypatch.chdir(tmp_path)  # not a git repository: lm-eval asks git for a commit hash here
    caplog.set_level(logging.WARNING)
    assert main(["eval", str(folders["hires"]), "--limit", "2", "--batch-size", "4", "--bootstrap-iters", "0"]) == 0
    out, err = capfd.readouterr()
    lines = out.strip().splitlines()
    assert lines[0] == "| task | metric | value | stderr |" and all(line.startswith("|") for line in lines)
    warnings = [record.getMessage() for record in caplog.records if record.name.startswith("lm_eval")]
    assert warnings == []
    assert "fatal:" not in err and "Traceback" not in err
    assert not logging.getLogger("lm_eval.api.task").filters  # the silencing ends with our call


@pytest.mark.slow
def test_lm_eval_cli_runs_a_saved_hires_folder_as_remote_code(folders: dict[str, Path], tmp_path: Path) -> None:
    """Plain `lm_eval run --model hf` in a process that never imports hires_hf: the folder's own code runs."""
    modules = tmp_path / "modules"
    env = {**os.environ, "HF_MODULES_CACHE": str(modules), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [
        sys.executable, "-m", "lm_eval", "run", "--model", "hf",
        "--model_args", f"pretrained={folders['hires']},trust_remote_code=True,dtype=float32",
        "--device", "cpu", "--tasks", "stdlib_next_line", "--include_path", str(harness.TASKS_DIR),
        "--limit", "8", "--batch_size", "4", "--output_path", str(tmp_path / "out"),
    ]  # fmt: skip
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert list(modules.rglob("modeling_hires.py")), "the remote modeling code was not used"
    (result_file,) = (tmp_path / "out").rglob("results_*.json")
    theirs = json.loads(result_file.read_text())["results"]["stdlib_next_line"]
    manager = harness.task_manager(["stdlib_next_line"])
    ours = harness.evaluate(
        str(folders["hires"]), ["stdlib_next_line"], manager, limit=8, batch_size=4, dtype="float32", device="cpu"
    )
    assert theirs["acc,none"] == ours["results"]["stdlib_next_line"]["acc,none"]
    assert theirs["acc_norm,none"] == ours["results"]["stdlib_next_line"]["acc_norm,none"]


# ---------------------------------------------------------------- perplexity


@pytest.mark.parametrize(("n", "window", "stride"), [(1, 4, 4), (10, 4, 4), (10, 4, 1), (17, 8, 3), (3, 8, 8)])
def test_windows_score_every_token_once_with_enough_context(n: int, window: int, stride: int) -> None:
    scored = []
    for start, end, first in windows(n, window, stride):
        assert end - start <= window and end - first <= stride
        assert first - start >= min(first, window - stride)  # full context once past the start
        scored += range(first, end)
    assert scored == list(range(n))


def test_perplexity_matches_lm_eval_loglikelihood_rolling(folders: dict[str, Path]) -> None:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    text = (STDLIB / "bisect.py").read_text()[:2500]
    tokenizer = AutoTokenizer.from_pretrained(folders["hires"])
    model = AutoModelForCausalLM.from_pretrained(folders["hires"], dtype=torch.float32).eval()
    window = 48
    lm = HFLM(pretrained=model, tokenizer=tokenizer, max_length=window, batch_size=4, device="cpu")
    request = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)
    (loglikelihood,) = lm.loglikelihood_rolling([request], disable_tqdm=True)

    ours = sliding_window_perplexity(model, tokenizer, text, window=window, stride=window, batch_size=3, progress=False)
    assert ours.tokens > 3 * window  # several windows, the last one partial
    assert -ours.nll == pytest.approx(loglikelihood, rel=1e-5)
    assert ours.bits_per_byte == pytest.approx(-loglikelihood / len(text.encode()) / math.log(2), rel=1e-5)
    # Context matters for this model, so the check above would catch a misplaced window.
    overlapping = sliding_window_perplexity(model, tokenizer, text, window=window, stride=8, progress=False)
    assert abs(overlapping.nll - ours.nll) > 1e-5 * ours.nll  # more context per token: other numbers, not noise


def test_perplexity_cli(folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text_file = tmp_path / "text.py"
    text_file.write_text((STDLIB / "bisect.py").read_text()[:1500])
    out = tmp_path / "ppl.json"
    argv = ["perplexity", str(folders["hires"]), str(text_file), "--window", "32", "--stride", "16", "--out", str(out)]
    assert main([*argv, "--device", "cpu"]) == 0
    written = json.loads(out.read_text())
    assert written["window"] == 32 and written["stride"] == 16
    assert written["perplexity"] == pytest.approx(math.exp(written["nll"] / written["tokens"]))
    assert f"perplexity {written['perplexity']:.4f}" in capsys.readouterr().out


# ---------------------------------------------------------------- scaling


def _ladder(laws: dict[str, PowerLaw], noise: float, points: int = 12, seed: int = 0) -> list[Point]:
    rng = np.random.default_rng(seed)
    compute = np.geomspace(1e15, 1e19, points)
    return [
        Point(arch=arch, params=int(c / 1e9), flops=float(c), loss=float(loss))
        for arch, law in laws.items()
        for c, loss in zip(compute, law.loss(compute) * np.exp(rng.normal(0, noise, points)))
    ]


@pytest.mark.parametrize("irreducible", [False, True], ids=["power-law", "power-law+E"])
def test_scaling_fit_recovers_a_known_law_and_multiplier(irreducible: bool) -> None:
    multiplier, alpha, A = 1.3, 0.08, 40.0
    E = 1.2 if irreducible else 0.0
    # HiRes reaches the control's loss with 1/1.3 of the compute at every C: L_h(C) = L_c(1.3 C).
    laws = {"control": PowerLaw(A, alpha, E), "hires": PowerLaw(A * multiplier**-alpha, alpha, E)}
    # With E, A and E trade off against each other: the same 2% needs less noise (0.02% vs 0.05% of the loss).
    runs = _ladder(laws, noise=0.0002 if irreducible else 0.0005)
    report = analyse(runs, irreducible=irreducible, bootstrap=200)
    for arch, law in laws.items():
        fitted = report.fits[arch].law
        assert fitted.A == pytest.approx(law.A, rel=0.02)
        assert fitted.alpha == pytest.approx(law.alpha, rel=0.02)
        assert fitted.E == pytest.approx(law.E, abs=0.02)
    (found,) = report.multipliers
    assert found.value == pytest.approx(multiplier, rel=0.02)
    assert found.ci_low < multiplier < found.ci_high


def test_multiplier_is_the_same_at_a_loss_or_at_the_matching_compute() -> None:
    laws = {"control": PowerLaw(30.0, 0.06), "hires": PowerLaw(28.0, 0.061)}
    at_compute = analyse(_ladder(laws, noise=0.0), at_compute=1e18, bootstrap=0).multipliers[0]
    at_loss = analyse(_ladder(laws, noise=0.0), at_loss=at_compute.at_loss, bootstrap=0).multipliers[0]
    assert at_loss.value == pytest.approx(at_compute.value, rel=1e-9)
    assert at_loss.at_compute == pytest.approx(1e18, rel=1e-9)
    assert fit_power_law([1e15, 1e17], [laws["hires"].loss(1e15), laws["hires"].loss(1e17)]).alpha == pytest.approx(
        0.061
    )


@pytest.mark.parametrize("suffix", ["json", "jsonl"])
def test_scaling_cli_writes_fit_and_plot(tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture) -> None:
    runs = _ladder({"control": PowerLaw(30.0, 0.06), "hires": PowerLaw(29.0, 0.06)}, noise=0.001, points=4)
    records = [run.__dict__ for run in runs]
    path = tmp_path / f"runs.{suffix}"
    if suffix == "json":
        path.write_text(json.dumps({"runs": records}))
    else:
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    assert read_runs(path) == runs
    assert main(["scaling", str(path), "--out-dir", str(tmp_path / "fit"), "--bootstrap", "50"]) == 0
    fit = json.loads((tmp_path / "fit" / "scaling_fit.json").read_text())
    assert set(fit["fits"]) == {"control", "hires"} and fit["multipliers"][0]["arch"] == "hires"
    assert (tmp_path / "fit" / "scaling_fit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "FLOPs-efficiency multiplier of hires over control" in capsys.readouterr().out


# ---------------------------------------------------------------- bad input: one line, exit code 2


def _runs_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "runs.jsonl"
    path.write_text(text)
    return str(path)


GOOD = '{"arch": "hires", "params": 10, "flops": 1e15, "loss": 3.0}\n'
BAD_INPUTS = {
    "missing-include-path": (lambda f, t: ["eval", str(f["hires"]), "--include-path", str(t / "nope")], "not a folder"),
    "no-tokenizer": (lambda f, t: ["eval", str(f["no_tokenizer"]), "--limit", "2"], "tokenizer"),
    "no-model-folder": (lambda f, t: ["eval", str(t / "missing"), "--limit", "2"], "does not exist"),
    "malformed-runs-line": (lambda f, t: ["scaling", _runs_file(t, GOOD + "{oops\n")], "runs.jsonl:2: not valid JSON"),
    "runs-missing-field": (lambda f, t: ["scaling", _runs_file(t, '{"arch": "a", "flops": 1}\n')], "missing params"),
    "runs-negative-loss": (lambda f, t: ["scaling", _runs_file(t, GOOD.replace("3.0", "-1"))], "positive number"),
    "one-point-per-arch": (lambda f, t: ["scaling", _runs_file(t, GOOD)], "at least 2"),
    "runs-file-missing": (lambda f, t: ["scaling", str(t / "none.jsonl")], "does not exist"),
    "stride-over-window": (
        lambda f, t: ["perplexity", str(f["hires"]), str(STDLIB / "bisect.py"), "--window", "8", "--stride", "9"],
        "stride",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_is_one_clear_line(
    case: str, folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    build_argv, expected = BAD_INPUTS[case]
    assert main(build_argv(folders, tmp_path)) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("hires-hf ") and expected in error[0]


@pytest.mark.slow
def test_unknown_task_is_one_clear_line(folders: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """Looked up in lm-eval's own index too (slow: ~15k tasks), then refused with the offline names."""
    assert main(["eval", str(folders["hires"]), "--tasks", "stdlib_next_lines"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unknown task 'stdlib_next_lines'" in line and "stdlib_next_line" in line


def test_the_bootstrap_is_never_more_certain_than_the_seed_noise() -> None:
    """Three points exactly on their laws: resampled residuals give a zero-width interval; seed noise widens it."""
    laws = {"control": PowerLaw(30.0, 0.06), "hires": PowerLaw(29.5, 0.06)}
    runs = _ladder(laws, noise=0.0, points=3)
    exact = analyse(runs, bootstrap=300).multipliers[0]
    assert exact.ci_high - exact.ci_low == pytest.approx(0.0, abs=1e-6)
    noisy = analyse(runs, bootstrap=300, noise=0.02).multipliers[0]
    assert noisy.value == pytest.approx(exact.value)
    assert noisy.ci_low < noisy.value < noisy.ci_high
    assert noisy.ci_high - noisy.ci_low > 0.1  # 0.02 nats on 3 points: the multiplier is far from pinned
