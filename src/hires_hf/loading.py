"""A HiRes config from what a user names: a preset, a config.json, or a model folder; `FIELD=VALUE` overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .configuration_hires import PRESETS, HiResConfig
from .errors import HiResUserError


def load_config(spec: str) -> HiResConfig:
    """A preset name, a config.json, or a model folder holding one."""
    if spec in PRESETS:
        return HiResConfig.from_preset(spec)
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise HiResUserError(
            f"{spec!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a config.json / model folder."
        )
    try:
        fields = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise HiResUserError(f"{path} is not valid JSON ({error}); pass a HiRes config.json.") from error
    if fields.get("model_type", "hires") != "hires":
        raise HiResUserError(
            f"{path} describes a {fields['model_type']!r} model, not HiRes; convert it first with `hires-hf convert`."
        )
    return HiResConfig.from_dict(fields)


def with_overrides(config: HiResConfig, items: list[str]) -> HiResConfig:
    """`config` with `--override FIELD=VALUE` items applied; fields left to their derived default follow them."""
    fields = config.to_dict()
    return type(config).from_dict({**fields, **_parse_overrides(items, fields)})


def _parse_overrides(items: list[str], fields: dict[str, Any]) -> dict[str, Any]:
    """FIELD=VALUE items as config fields: VALUE read as JSON (numbers, booleans, lists), else kept as a string."""
    overrides = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            raise HiResUserError(
                f"--override {item!r}: expected FIELD=VALUE naming a config field (e.g. vocab_size=1024)."
            )
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw  # a bare string such as write_mode=delta
    return overrides


__all__ = ["load_config", "with_overrides"]
