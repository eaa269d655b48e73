"""Vanilla checkpoints (Llama, Mistral, Qwen2, Qwen3, OLMoE) into HiRes models: `hires-hf convert`."""

from .convert import ConversionCheckError, ConversionReport, convert
from .keymaps import KEY_MAPS, Rule

__all__ = ["KEY_MAPS", "ConversionCheckError", "ConversionReport", "Rule", "convert"]
