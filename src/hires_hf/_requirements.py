"""Fail fast, in one line, on a transformers older than the package needs (a GPU image may carry 5.17)."""

import transformers

NEEDED = (5, 24)

if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < NEEDED:
    raise ImportError(
        f"hires-hf needs transformers >= 5.24 (found {transformers.__version__}): "
        "pip install -U 'transformers>=5.24,<5.30'"
    )
