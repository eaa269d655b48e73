"""`hires-hf publish`: the folder the Hub receives, its model card, loading it without hires_hf, the upload.

Nothing here touches the network: dry runs write folders, the upload path talks to a fake HfApi.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from huggingface_hub.errors import HfHubHTTPError
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerFast

from hires_hf import HiResConfig, HiResForCausalLM
from hires_hf import publish as publish_module
from hires_hf.accounting import forward_flops_per_token
from hires_hf.cli import main
from hires_hf.errors import HiResUserError
from hires_hf.model_card import build_model_card
from hires_hf.publish import publish
from hires_hf.training import build_tokenizer, special_token_ids

REPO_ID = "hires-org/hires-tiny"
TEXT = "def read_config(path):\n    return json.loads(path.read_text())"


def byte_level_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """The package's byte-level BPE, trained on a few stdlib sources: offline, and real enough to merge pairs."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [path.read_text(encoding="utf-8", errors="ignore")[:3000] for path in sorted(stdlib.glob("*.py"))[:20]]
    return build_tokenizer(texts, vocab_size=vocab_size)


def save_source(folder: Path, preset: str) -> Path:
    """A trained-looking folder: a converted tiny HiRes, its tokenizer, and training debris that must not ship."""
    tokenizer = byte_level_tokenizer()
    config = HiResConfig.from_preset(
        preset,
        vocab_size=len(tokenizer),
        **special_token_ids(tokenizer),
        hires_conversion={"base_model": "allenai/OLMoE-1B-7B-0924"},
        hires_training={"datasets": ["allenai/dolma"]},
    )
    torch.manual_seed(0)
    model = HiResForCausalLM(config)
    with torch.no_grad():  # move norms and projections off their initial values
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "training_args.bin").write_bytes(b"pickle")
    (folder / "optimizer.pt").write_bytes(b"pickle")
    (folder / "checkpoint-10").mkdir()
    (folder / "checkpoint-10" / "model.safetensors").write_bytes(b"")
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_source(tmp_path_factory.mktemp("source") / "checkpoint", "tiny")


@pytest.fixture(scope="module")
def results_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shape lm-eval's simple_evaluate / --output_path writes (scores made up for the test)."""
    path = tmp_path_factory.mktemp("eval") / "results_2025-01-01T00-00-00.json"
    report = {
        "results": {
            "hellaswag": {"alias": "hellaswag", "acc,none": 0.2871, "acc_stderr,none": 0.0045, "acc_norm,none": 0.31},
            "local_ppl": {"alias": "local_ppl", "word_perplexity,none": 41.5, "bits_per_byte,none": 1.25},
        },
        "configs": {"hellaswag": {"dataset_path": "Rowan/hellaswag"}, "local_ppl": {"dataset_path": "json"}},
        "n-shot": {"hellaswag": 0, "local_ppl": 0},
    }
    path.write_text(json.dumps(report))
    return path


@pytest.fixture(scope="module")
def hub_folder(model_dir: Path, results_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dry") / "hub"
    publish(model_dir, REPO_ID, dry_run=out, results=results_file, license="apache-2.0", max_shard_size="150KB")
    return out


# ---------------------------------------------------------------------------------------------- the folder
def test_dry_run_folder_holds_exactly_the_hub_files(hub_folder: Path) -> None:
    files = {path.name for path in hub_folder.iterdir()}
    index = json.loads((hub_folder / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1, "max_shard_size should have split the weights"
    expected = {
        "README.md",
        "config.json",
        "generation_config.json",
        "configuration_hires.py",
        "modeling_hires.py",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors.index.json",
        *shards,
    }
    assert files == expected
    assert all((hub_folder / name).is_file() for name in files)
    auto_map = json.loads((hub_folder / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForCausalLM"] == "modeling_hires.HiResForCausalLM"
    assert {target.split(".")[0] + ".py" for target in auto_map.values()} <= files
    assert not list(hub_folder.parent.glob(".hub.tmp-*")), "the staging folder must be renamed, not left behind"


def test_published_tokenizer_truncates_at_the_context_without_loading_flags(hub_folder: Path) -> None:
    """Publish reloads the tokenizer to save it again: the loading flags it was read with stay out of the folder,
    and `model_max_length` is the model's context (pipelines and lm-eval truncate with it), not 1e30."""
    saved = json.loads((hub_folder / "tokenizer_config.json").read_text())
    context = json.loads((hub_folder / "config.json").read_text())["max_position_embeddings"]
    assert not {"is_local", "local_files_only"} & set(saved)
    assert saved["model_max_length"] == context
    assert PreTrainedTokenizerFast.from_pretrained(hub_folder).model_max_length == context


def test_card_parses_and_carries_metadata(hub_folder: Path, model_dir: Path) -> None:
    card = ModelCard.load(hub_folder / "README.md")
    data = card.data
    assert data.library_name == "transformers"
    assert data.pipeline_tag == "text-generation"
    assert "hires" in data.tags and "moe" not in data.tags
    assert data.license == "apache-2.0"
    assert data.base_model == "allenai/OLMoE-1B-7B-0924"
    assert data.datasets == ["allenai/dolma"]
    scores = {(r.task_name, r.metric_type): r for r in data.eval_results}
    assert scores["hellaswag", "acc"].metric_value == pytest.approx(0.2871)
    assert scores["hellaswag", "acc"].dataset_type == "Rowan/hellaswag"
    assert scores["local_ppl", "word_perplexity"].dataset_type == "local_ppl"  # local json task: no Hub dataset
    assert not any("stderr" in metric for _, metric in scores)
    config = HiResConfig.from_pretrained(model_dir)
    flops = forward_flops_per_token(config, seq_len=min(2048, config.max_position_embeddings))
    assert f"| residual width D (`residual_size`) | {config.residual_size} |" in card.text
    assert f"| blocks B = L / k | {config.num_blocks} |" in card.text
    assert f"{flops:,.0f}" in card.text
    assert f'AutoModelForCausalLM.from_pretrained("{REPO_ID}", trust_remote_code=True)' in card.text


def test_card_takes_the_published_models_scores_from_a_hires_hf_eval_file(results_file: Path, tmp_path: Path) -> None:
    """`hires-hf eval A B --out eval.json` keeps one lm-eval report a model; publishing B reads B's."""
    report = json.loads(results_file.read_text())
    other = {"results": {"hellaswag": {"acc,none": 0.25}}}
    models = tmp_path / "runs"
    evaluated = tmp_path / "eval.json"
    evaluated.write_text(json.dumps({"models": {str(models / "control"): other, str(models / "hires"): report}}))
    config = HiResConfig.from_preset("tiny")
    card = ModelCard(str(build_model_card(config, REPO_ID, results=evaluated, model=models / "hires")))
    scores = {(r.task_name, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert scores["hellaswag", "acc"] == pytest.approx(0.2871)
    with pytest.raises(HiResUserError, match="holds the results of 2 models") as refused:
        build_model_card(config, REPO_ID, results=evaluated, model=models / "elsewhere")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("preset, is_moe", [("tiny", False), ("tiny-moe", True)], ids=["dense", "moe"])
def test_card_tags_moe_and_counts_experts(preset: str, is_moe: bool) -> None:
    config = HiResConfig.from_preset(preset)
    card = ModelCard(str(build_model_card(config, REPO_ID, revision="v1")))
    assert ("moe" in card.data.tags) is is_moe
    assert card.data.base_model is None and card.data.license == "other"
    expected = f"{config.num_experts}, top-{config.num_experts_per_tok}" if is_moe else "dense"
    assert f"| experts (E, top-K, expert width) | {expected}" in card.text
    assert 'revision="v1"' in card.text


# ---------------------------------------------------------------------------------------------- remote code
ISOLATED_LOAD = """
import importlib.abc, sys

class BlockHiRes(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "hires_hf" or name.startswith("hires_hf."):
            raise ImportError(f"{name} is blocked: the Hub folder must load without it")
        return None

sys.meta_path.insert(0, BlockHiRes())
try:
    import hires_hf
    raise SystemExit("hires_hf is importable: the test would prove nothing")
except ImportError:
    pass

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

text, pairs = sys.argv[1], sys.argv[2:]
for folder, out in zip(pairs[::2], pairs[1::2]):
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    save_file({"input_ids": ids, "logits": logits.contiguous()}, out)
"""


CARD_SNIPPET = """
import importlib.abc, sys

class BlockHiRes(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "hires_hf" or name.startswith("hires_hf."):
            raise ImportError(f"{name} is blocked: the card's snippet must work without it")
        return None

sys.meta_path.insert(0, BlockHiRes())
"""


@pytest.mark.slow
def test_card_snippet_runs_without_the_package_and_asks_nothing(hub_folder: Path, tmp_path: Path) -> None:
    """The Usage section, as written, in a Python without hires_hf: it loads and generates, with no
    'Do you wish to run the custom code? [y/N]' prompt (stdin is closed) and no model-type warning."""
    card = (hub_folder / "README.md").read_text()
    snippet = card.split("```python\n", 1)[1].split("```", 1)[0].replace(f'"{REPO_ID}"', repr(str(hub_folder)))
    script = tmp_path / "snippet.py"
    script.write_text(textwrap.dedent(CARD_SNIPPET) + snippet)
    done = subprocess.run(
        [sys.executable, "-I", str(script)],
        cwd=tmp_path,
        env={**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": ""},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("def fibonacci(n):")
    printed = done.stdout + done.stderr
    for noise in ("custom code", "[y/N]", "trust_remote_code", "model of type"):
        assert noise not in printed, printed[-2000:]


@pytest.mark.slow
def test_hub_folder_loads_without_hires_hf_and_matches_logits(
    hub_folder: Path, model_dir: Path, tmp_path: Path
) -> None:
    """Dense and MoE: the folder's remote code, in a process that cannot import hires_hf, gives our logits."""
    moe_dir = save_source(tmp_path / "moe-source", "tiny-moe")
    moe_folder = Path(publish(moe_dir, REPO_ID, dry_run=tmp_path / "moe-hub"))
    cases = {"dense": (model_dir, hub_folder), "moe": (moe_dir, moe_folder)}
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(ISOLATED_LOAD))
    pairs = [str(arg) for name, (_, folder) in cases.items() for arg in (folder, tmp_path / f"{name}.safetensors")]
    done = subprocess.run(
        [sys.executable, "-I", str(script), TEXT, *pairs],
        cwd=tmp_path,
        env={**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    for name, (source_dir, _) in cases.items():
        remote = load_file(tmp_path / f"{name}.safetensors")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(source_dir)
        source = HiResForCausalLM.from_pretrained(source_dir, dtype=torch.float32).eval()
        ids = tokenizer(TEXT, return_tensors="pt").input_ids
        assert torch.equal(remote["input_ids"], ids), name
        with torch.no_grad():
            logits = source(ids).logits
        torch.testing.assert_close(remote["logits"], logits, rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}")


# ---------------------------------------------------------------------------------------------- errors
def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["publish", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("repo_id", ["no-namespace", "org/na me", "org/a/b", "org/-bad"], ids=str)
def test_bad_repo_id_is_one_line_and_builds_nothing(
    repo_id: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _cli(capsys, str(model_dir), "--repo-id", repo_id, "--dry-run", str(tmp_path / "out"))
    assert code != 0
    assert err.count("\n") == 1 and "repo id" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_offline_is_a_clear_error(model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(publish_module, "HfApi", _unreachable_api)
    code, err = _cli(capsys, str(model_dir), "--repo-id", REPO_ID)
    assert code != 0 and err.count("\n") == 1 and "HF_HUB_OFFLINE" in err


def test_missing_token_is_a_clear_error(model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(publish_module, "get_token", lambda: None)
    monkeypatch.setattr(publish_module, "HfApi", _unreachable_api)
    code, err = _cli(capsys, str(model_dir), "--repo-id", REPO_ID)
    assert code != 0 and err.count("\n") == 1 and "token" in err


def test_rejected_token_uploads_nothing(model_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    api = FakeHfApi(whoami_errors=[_http_error(401)])
    with pytest.raises(HiResUserError, match="rejected the token"):
        publish(model_dir, REPO_ID, token="hf_bad", api=api, retry_delay=0)
    assert api.calls == ["whoami"]


def test_dry_run_refuses_a_non_empty_out(model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(HiResUserError, match="already exists"):
        publish(model_dir, REPO_ID, dry_run=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_folder_without_tokenizer_is_refused(model_dir: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((model_dir / "config.json").read_text())
    with pytest.raises(HiResUserError, match="no tokenizer"):
        publish(bare, REPO_ID, dry_run=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _damaged_copy(model_dir: Path, folder: Path, damage: str) -> Path:
    """A copy of the source folder with one thing wrong, as a user might hand it to publish."""
    folder.mkdir()
    for item in model_dir.iterdir():
        if item.is_file():
            (folder / item.name).write_bytes(item.read_bytes())
    if damage == "no-weights":
        (folder / "model.safetensors").unlink()
    elif damage == "truncated-weights":
        weights = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    elif damage == "config-not-the-weights":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "residual_size": 2 * config["residual_size"]}))
    elif damage == "corrupt-tokenizer":
        (folder / "tokenizer.json").write_text("{not json")
    elif damage == "tokenizer-config-only":
        (folder / "tokenizer.json").unlink()
    return folder


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("no-weights", "cannot load the weights"),
        ("truncated-weights", "cannot load the weights"),
        ("config-not-the-weights", "do not match config.json"),
        ("corrupt-tokenizer", "cannot load the tokenizer"),
        ("tokenizer-config-only", "cannot load the tokenizer"),
    ],
)
def test_invalid_folder_is_one_line_and_writes_nothing(
    damage: str, message: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _damaged_copy(model_dir, tmp_path / "model", damage)
    capsys.readouterr()
    code, err = _cli(capsys, str(folder), "--repo-id", REPO_ID, "--dry-run", str(tmp_path / "out"))
    errors = [line for line in err.splitlines() if "error" in line.lower()]  # besides transformers' progress bars
    assert code == 2 and "Traceback" not in err
    assert len(errors) == 1 and errors[0].startswith("hires-hf publish: error:") and message in errors[0], err
    assert "LOAD REPORT" not in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_folder_that_breaks_the_promise_is_one_line(
    model_dir: Path, tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The final check on the built folder (only our module files, no pickles, shards as indexed) is a user error,
    not a RuntimeError traceback: here a tokenizer whose saving leaves code of its own next to the weights."""
    save_tokenizer = publish_module._save_tokenizer

    def tokenizer_with_code(source: Path, staging: Path, model_max_length: int) -> None:
        save_tokenizer(source, staging, model_max_length)
        (staging / "tokenization_custom.py").write_text("class CustomTokenizer: ...\n")

    monkeypatch.setattr(publish_module, "_save_tokenizer", tokenizer_with_code)
    code, err = _cli(capsys, str(model_dir), "--repo-id", REPO_ID, "--dry-run", str(tmp_path / "out"))
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("hires-hf publish: error:") and "tokenization_custom.py" in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- upload (fake Hub)
class FakeHfApi:
    """Records calls; `upload_errors` are raised by successive upload_folder calls before one succeeds."""

    def __init__(self, upload_errors: list[Exception] | None = None, whoami_errors: list[Exception] | None = None):
        self.upload_errors, self.whoami_errors = list(upload_errors or []), list(whoami_errors or [])
        self.calls: list[str] = []
        self.uploads: list[dict] = []
        self.commits: list[set[str]] = []

    def whoami(self, token=None):
        self.calls.append("whoami")
        if self.whoami_errors:
            raise self.whoami_errors.pop(0)
        return {"name": "tester", "auth": {"accessToken": {"role": "write"}}}

    def create_repo(self, repo_id, **kwargs):
        self.calls.append("create_repo")
        self.repo = (repo_id, kwargs)

    def create_branch(self, repo_id, **kwargs):
        self.calls.append("create_branch")

    def upload_folder(self, **kwargs):
        self.calls.append("upload_folder")
        self.uploads.append(kwargs)
        if self.upload_errors:
            raise self.upload_errors.pop(0)
        self.commits.append({path.name for path in Path(kwargs["folder_path"]).iterdir()})
        return type("CommitInfo", (), {"commit_url": f"https://huggingface.co/{kwargs['repo_id']}/commit/abc"})()


def _unreachable_api(*args, **kwargs):
    raise AssertionError("no Hub client may be made before the checks fail")


def _http_error(status: int) -> HfHubHTTPError:
    request = type("Request", (), {"url": "https://huggingface.co/api"})()
    response = type("Response", (), {"status_code": status, "headers": {}, "request": request})()
    return HfHubHTTPError(f"{status} from the Hub", response=response)


def test_upload_is_one_commit_retried_on_transient_errors(model_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    api = FakeHfApi(upload_errors=[_http_error(503), ConnectionError("reset by peer")])
    url = publish(
        model_dir,
        REPO_ID,
        token="hf_test",
        private=True,
        commit_message="v1",
        api=api,
        retry_delay=0,
        max_shard_size="150KB",
    )
    assert url.startswith(f"https://huggingface.co/{REPO_ID}/commit/")
    assert api.calls == ["whoami", "create_repo", "upload_folder", "upload_folder", "upload_folder"]
    assert api.repo == (REPO_ID, {"token": "hf_test", "private": True, "repo_type": "model", "exist_ok": True})
    assert len(api.commits) == 1
    (files,) = api.commits
    assert {"README.md", "config.json", "modeling_hires.py", "configuration_hires.py", "tokenizer.json"} <= files
    assert not {"training_args.bin", "optimizer.pt", "checkpoint-10"} & files
    assert api.uploads[-1]["commit_message"] == "v1"
    assert not Path(api.uploads[-1]["folder_path"]).exists(), "the temporary folder must be cleaned up"


@pytest.mark.parametrize("status", [403, 404], ids=["forbidden", "not-found"])
def test_permanent_hub_errors_are_not_retried(status: int, model_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    api = FakeHfApi(upload_errors=[_http_error(status)])
    with pytest.raises(HiResUserError, match=f"HTTP {status}"):
        publish(model_dir, REPO_ID, token="hf_test", revision="dev", api=api, retry_delay=0)
    assert api.calls == ["whoami", "create_repo", "create_branch", "upload_folder"]
    assert api.uploads[0]["revision"] == "dev"


def test_retries_give_up_with_a_clear_error() -> None:
    calls = []

    def always_busy() -> None:
        calls.append(1)
        raise _http_error(503)

    with pytest.raises(HiResUserError, match="after 3 tries"):
        publish_module.with_retries(always_busy, what="uploading", attempts=3, delay=0)
    assert len(calls) == 3
