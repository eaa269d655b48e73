"""Fail fast, in one line, on a transformers older than the package needs (pyproject.toml states the same floor).

5.16.1 is the oldest transformers vLLM 0.32 accepts (it pins `>=5.16.1,<5.20`); the model files run there too,
and the non-slow suite passes on it but for tests of 5.24-only APIs (docs/ecosystem.md lists them).
"""

import transformers
from packaging.version import Version

FLOOR = "5.16.1"
CEILING = "5.30"

if Version(transformers.__version__) < Version(FLOOR):
    raise ImportError(
        f"hires-hf needs transformers >= {FLOOR} (found {transformers.__version__}): "
        f"pip install -U 'transformers>={FLOOR},<{CEILING}'"
    )
