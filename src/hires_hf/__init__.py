"""hires-hf: HiRes (Hierarchical Residuals) models for transformers.

`import hires_hf` registers the `hires` model type with transformers' Auto classes, so that
`AutoConfig`, `AutoModel`, `AutoModelForCausalLM` and `AutoModelForSequenceClassification` load HiRes
folders without `trust_remote_code`.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
)

from . import _requirements  # noqa: F401  (before the model code: one line on a transformers too old for it)
from .configuration_hires import PRESETS, HiResConfig
from .modeling_hires import (
    HiResForCausalLM,
    HiResForSequenceClassification,
    HiResModel,
    HiResPreTrainedModel,
)

__version__ = "0.1.0"

AutoConfig.register("hires", HiResConfig, exist_ok=True)
AutoModel.register(HiResConfig, HiResModel, exist_ok=True)
AutoModelForCausalLM.register(HiResConfig, HiResForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(HiResConfig, HiResForSequenceClassification, exist_ok=True)

# `save_pretrained` then writes `auto_map` and copies configuration_hires.py / modeling_hires.py next to the
# weights, so the folder also loads with `trust_remote_code=True` where this package is not installed.
HiResConfig.register_for_auto_class()
HiResModel.register_for_auto_class("AutoModel")
HiResForCausalLM.register_for_auto_class("AutoModelForCausalLM")
HiResForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

__all__ = [
    "PRESETS",
    "HiResConfig",
    "HiResForCausalLM",
    "HiResForSequenceClassification",
    "HiResModel",
    "HiResPreTrainedModel",
    "__version__",
]
