"""The `hires-hf` command line: commands registered, bad input reported in one line with exit code 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hires_hf.cli as cli
from hires_hf.cli import build_parser, main


def test_info_prints_costs_next_to_the_vanilla_twin(capsys: pytest.CaptureFixture) -> None:
    assert main(["info", "tiny", "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "vanilla twin" in out and "HiRes (D=128, k=2)" in out and "overhead" in out
    assert "context of 64 tokens" in out  # the context the FLOPs depend on is said, not assumed
    assert main(["info", "tiny"]) == 0  # by default, the model's own context
    assert "context of 512 tokens (the model's max_position_embeddings" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["info", "no-such-preset"], "neither a preset"),
        (["info", "{folder}"], "'llama' model, not HiRes"),
        (["info", "{broken}"], "not valid JSON"),
    ],
    ids=["unknown-preset", "foreign-config", "corrupt-config"],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, fragment, tmp_path, capsys) -> None:
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "broken.json").write_text("{not json")
    paths = {"folder": tmp_path / "llama", "broken": tmp_path / "broken.json"}
    assert main([arg.format(**paths) for arg in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_invalid_config_file_reports_the_field(tmp_path, capsys) -> None:
    from hires_hf import HiResConfig

    fields = HiResConfig.from_preset("tiny").to_dict() | {"layers_per_block": 3}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    assert main(["info", str(tmp_path)]) == 2
    assert "layers_per_block=3" in capsys.readouterr().err


# Every command the README documents (the benchmarks are the checkout's `python -m benchmarks`, not a command).
COMMANDS = {
    "info",
    "convert",
    "train",
    "demo",
    "ladder",
    "compare",
    "eval",
    "perplexity",
    "scaling",
    "inspect",
    "publish",
}


def _subcommands(parser) -> dict:
    return next(action for action in parser._actions if action.dest == "command").choices


def test_every_command_is_there_with_a_handler() -> None:
    subcommands = _subcommands(build_parser())
    assert set(subcommands) == COMMANDS
    for name, sub in subcommands.items():
        assert sub.get_default("func") is not None, name


def test_a_command_module_that_fails_to_import_is_not_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken import inside the package raises instead of quietly dropping its commands."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "hires_hf.no_such_commands"))
    with pytest.raises(ModuleNotFoundError, match=r"hires_hf\.no_such_commands"):
        build_parser()


PROBE = (
    "import sys; from hires_hf.cli import build_parser; parser = build_parser(); "
    "commands = next(a for a in parser._actions if a.dest == 'command').choices; "
    "print(sorted(commands), any(name.split('.')[0] == 'benchmarks' for name in sys.modules))"
)


def test_the_command_line_is_the_same_from_any_directory(tmp_path) -> None:
    """The installed package never looks at the current directory: from the checkout's root (where `benchmarks`
    is importable) and from elsewhere, the same commands, and the checkout's benchmarks are never imported."""
    root = Path(__file__).resolve().parents[1]
    outputs = [
        subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True, check=True).stdout
        for cwd in (root, tmp_path)
    ]
    assert outputs[0] == outputs[1]
    assert outputs[0].rstrip().endswith("False"), outputs[0]


def test_every_sub_command_is_wired_in_the_commands_folder() -> None:
    """Library modules hold library code; every sub-command's argparse wiring is in hires_hf/commands/."""
    package = Path(cli.__file__).parent
    wired = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "def add_parsers(" in path.read_text() and path.parent.name != "commands"
    }
    assert not wired, sorted(wired)
    outside = {name for name in cli.COMMAND_MODULES if not name.startswith("hires_hf.commands.")}
    assert not outside, outside


def test_command_defaults_are_the_library_defaults() -> None:
    """A default is written once, where the library keeps it; the flags read it from there."""
    import inspect

    from hires_hf.conversion.convert import convert
    from hires_hf.eval.harness import evaluate
    from hires_hf.eval.scaling import analyse
    from hires_hf.experiments.demo import DemoSettings
    from hires_hf.publish import DEFAULT_SHARD_SIZE
    from hires_hf.training.trainer import TrainSettings

    def defaults(function) -> dict:
        return {name: p.default for name, p in inspect.signature(function).parameters.items()}

    parser = build_parser()
    train, settings = parser.parse_args(["train"]), TrainSettings(max_steps=1)
    assert (train.lr, train.weight_decay, train.grad_accum, train.save_steps, train.seed) == (
        settings.learning_rate,
        settings.weight_decay,
        settings.gradient_accumulation_steps,
        settings.save_steps,
        settings.seed,
    )
    demo, demo_settings = parser.parse_args(["demo"]), DemoSettings()
    assert (demo.budget_minutes, demo.preset, demo.seed) == (
        demo_settings.budget_minutes,
        demo_settings.preset,
        demo_settings.seed,
    )
    conversion = parser.parse_args(["convert", "src", "dst", "--residual-size", "64", "--layers-per-block", "2"])
    assert (conversion.dtype, conversion.max_shard_size) == (
        defaults(convert)["dtype"],
        defaults(convert)["max_shard_size"],
    )
    evaluation = parser.parse_args(["eval", "model"])
    assert (evaluation.batch_size, evaluation.bootstrap_iters) == (
        defaults(evaluate)["batch_size"],
        defaults(evaluate)["bootstrap_iters"],
    )
    scaling = parser.parse_args(["scaling", "runs.jsonl"])
    assert (scaling.baseline, scaling.bootstrap) == (defaults(analyse)["baseline"], defaults(analyse)["bootstrap"])
    assert parser.parse_args(["publish", "model", "--repo-id", "org/name"]).max_shard_size == DEFAULT_SHARD_SIZE
