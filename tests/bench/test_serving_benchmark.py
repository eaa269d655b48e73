"""benchmarks/serving.py without vLLM: it skips in one line, refuses a bad shape, and renders its saved results."""

import importlib.util
import json
from pathlib import Path

import pytest

from benchmarks import serving
from hires_hf.errors import HiResUserError

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "serving" / "serving.json"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed: the benchmark would run")
def test_without_vllm_the_section_is_skipped_in_one_line(tmp_path: Path, capsys) -> None:
    assert serving.run_serving(serving.ServingSettings(), tmp_path) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vLLM is not installed here" in err
    assert not list(tmp_path.iterdir())


def test_a_shape_vllm_cannot_serve_is_refused() -> None:
    args = serving.argparse.Namespace(
        serving_hidden_size=96, serving_batches="1,32", serving_dtypes="float32", serving_threads=1
    )
    with pytest.raises(HiResUserError, match="multiple of 64 of at least 256"):
        serving.settings_from(args)


def test_the_committed_table_has_every_row_and_the_flops_ideal() -> None:
    result = json.loads(RESULTS.read_text())
    rows = result["rows"]
    assert {(row["dtype"], row["batch"], row["phase"]) for row in rows} == {
        (dtype, batch, phase)
        for dtype in ("float32", "bfloat16")
        for batch in (1, 32)
        for phase in ("prefill", "decode")
    }
    assert all(0.85 < row["ideal"] < 1 for row in rows)  # HiRes counts ~8% more FLOPs than its twin here
    assert "| float32 | 1 | prefill |" in serving.render(result)
