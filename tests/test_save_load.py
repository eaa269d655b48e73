"""Round trips: save_pretrained -> from_pretrained bit for bit, and the saved folder as Hub remote code loaded by a
Python that cannot import hires_hf (docs/architecture.md, invariant 3)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForCausalLM

from hires_hf import HiResForCausalLM, HiResModel
from tests.util import VOCAB, tiny_hires

# Run in a child interpreter: any attempt to import hires_hf fails, as on a machine without the package.
BLOCK_HIRES = """
import sys
class _NoHiRes:
    def find_spec(self, name, path=None, target=None):
        if name == "hires_hf" or name.startswith("hires_hf."):
            raise ImportError("hires_hf is deliberately not importable here")
sys.meta_path.insert(0, _NoHiRes())
"""


def run_without_package(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(cwd / "modules_cache")}
    code = BLOCK_HIRES + textwrap.dedent(script)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_save_and_reload_gives_identical_logits(preset: str, tmp_path: Path) -> None:
    model = tiny_hires(preset)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(reloaded, HiResForCausalLM)
    for name, param in reloaded.state_dict().items():
        assert torch.equal(param, model.state_dict()[name]), name  # every tensor bit for bit
    ids = torch.randint(1, VOCAB, (2, 11))
    with torch.no_grad():
        expected, got = model(ids).logits, reloaded(ids).logits
    if preset == "tiny":
        assert torch.equal(got, expected)
    else:
        # The loaded weights sit at another memory alignment, and CPU kernels of the expert matmuls pick their
        # path by alignment: the same weights copied to a misaligned buffer move the logits by ~1e-6 too.
        assert (got - expected).abs().max() < 1e-5


def test_saved_folder_is_hub_ready(tmp_path: Path) -> None:
    tiny_hires().save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors", "configuration_hires.py", "modeling_hires.py"} <= files
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForCausalLM"] == "modeling_hires.HiResForCausalLM"
    assert auto_map["AutoModel"] == "modeling_hires.HiResModel"


def test_base_model_loads_from_a_causal_lm_folder(tmp_path: Path) -> None:
    model = tiny_hires()
    model.save_pretrained(tmp_path)
    base = AutoModel.from_pretrained(tmp_path)
    assert isinstance(base, HiResModel)
    expected = model.model.state_dict()  # the causal LM's body; the folder's lm_head has no place in a base model
    loaded = base.state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in loaded.items():
        assert torch.equal(tensor, expected[name]), name  # every tensor, not only the embedding


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_remote_code_loads_without_the_package(preset: str, tmp_path: Path) -> None:
    model = tiny_hires(preset)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    ids = torch.randint(1, VOCAB, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
    save_file({"ids": ids}, str(tmp_path / "ids.safetensors"))
    result = run_without_package(
        f"""
        import torch
        from safetensors.torch import load_file, save_file
        from transformers import AutoModelForCausalLM
        try:
            import hires_hf
            raise SystemExit("hires_hf should not be importable in this process")
        except ImportError:
            pass
        model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        ids = load_file("ids.safetensors")["ids"]
        with torch.no_grad():
            save_file({{"logits": model(ids).logits.contiguous()}}, "logits.safetensors")
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = load_file(str(tmp_path / "logits.safetensors"))["logits"]
    assert torch.equal(got, expected) if preset == "tiny" else (got - expected).abs().max() < 1e-5


def test_a_folder_with_the_old_nested_layer_names_is_refused_then_renamed(tmp_path: Path) -> None:
    """hires-hf 0.1 saved layer i of block b as model.blocks.{b}.layers.{i}: from_pretrained refuses such a folder
    in one line naming the rename command (it would otherwise load with random layers); after it, the folder loads
    with every tensor in place."""
    from hires_hf.conversion.legacy import main as rename_main

    model = tiny_hires()
    model.save_pretrained(tmp_path)
    k = model.config.layers_per_block
    state = load_file(str(tmp_path / "model.safetensors"))

    def nested(name: str) -> str:
        if not name.startswith("model.layers."):
            return name
        layer, rest = name.removeprefix("model.layers.").split(".", 1)
        return f"model.blocks.{int(layer) // k}.layers.{int(layer) % k}.{rest}"

    save_file({nested(name): tensor for name, tensor in state.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        ValueError, match=r"old nested layer names \(model\.blocks\.0\.layers\.0\..*hires_hf\.conversion\.legacy"
    ):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    assert rename_main([str(tmp_path)]) == 0
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    assert rename_main([str(tmp_path / "missing")]) == 2
