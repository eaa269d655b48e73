"""The test suite itself: it never reaches for the Hub, whatever the developer's shell exports."""

import os


def test_the_suite_is_offline_even_if_the_shell_says_otherwise() -> None:
    """conftest forces offline mode; `HF_HUB_OFFLINE=0 pytest` must still not download (tests/test_conversion.py
    asks for a Hub id that does not exist and expects the offline refusal, not a network round trip)."""
    from huggingface_hub import constants

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        assert os.environ[name] == "1", name
    assert constants.HF_HUB_OFFLINE
