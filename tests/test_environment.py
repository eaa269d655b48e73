"""The test suite itself: it never reaches for the Hub, whatever the developer's shell exports."""

import os
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")
PROBE = (
    "import runpy; runpy.run_path(sys.argv[1]); "
    "from huggingface_hub import constants; "
    "print(constants.HF_HUB_OFFLINE, constants.is_offline_mode())"
)


def test_the_suite_is_offline_even_if_the_shell_says_otherwise() -> None:
    """A developer's exported HF_HUB_OFFLINE=0 must not let a test download: a fresh Python whose shell says
    online, after the suite's conftest has run, sees the Hub as offline."""
    online = os.environ | {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}
    probe = subprocess.run(
        [sys.executable, "-c", f"import sys; {PROBE}", str(CONFTEST)],
        env=online,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.split() == ["True", "True"], probe.stdout + probe.stderr


def test_the_import_time_floor_is_the_one_pyproject_declares() -> None:
    """`import hires_hf` refuses exactly the transformers versions pip would refuse (src/hires_hf/_requirements.py)."""
    import re

    from hires_hf import _requirements

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    declared = re.search(r'"transformers>=([\d.]+),<([\d.]+)"', pyproject)
    assert declared is not None and declared.groups() == (_requirements.FLOOR, _requirements.CEILING)
