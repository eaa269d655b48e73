"""The defaults the README and docs/architecture.md state are the ones `HiResConfig` has (the config is the spec).

Each `| field | default | ... |` table row is read as a formula over the config's fields and checked against
configs that leave the field to its default; the write multiplier's base width quoted in prose is checked too.
"""

import re
from pathlib import Path
from typing import Any

import pytest
from transformers import LlamaConfig

from hires_hf import HiResConfig
from hires_hf.configuration_hires import DERIVED_DEFAULTS, WRITE_BASE_WIDTH

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/architecture.md")
ROW = re.compile(r"^\s*\| `(?P<field>\w+)`(?: \(`[^`]+`\))? \| (?P<default>[^|]+?) \|")
WORDS = {"on": True, "off": False}

# Configs that leave every field not named to its default: dense and MoE, with and without the outer norm, at
# several widths, so that a formula right at one width only (64 / d vs 128 / d at d=64...) is caught.
SHAPES = {
    "defaults": {},
    "d=128": {"hidden_size": 128, "intermediate_size": 344, "num_attention_heads": 4, "num_hidden_layers": 8},
    "d=512-no-outer-norm": {"hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 8, "outer_norm": False},
    "moe": {"hidden_size": 256, "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2},
    "init-0.01": {"initializer_range": 0.01},
}


def tables(page: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """Every `| field | default ...` table of a page: its header and its (field, default cell) rows."""
    found, header, rows = [], None, []
    for line in [*(ROOT / page).read_text().splitlines(), ""]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.strip().startswith("|") and cells[:1] == ["field"] and cells[1].startswith("default"):
            header, rows = cells[1], []
        elif header is not None and (match := ROW.match(line)):
            rows.append((match["field"], match["default"].strip()))
        elif header is not None and not line.strip().startswith("|"):
            found.append((header, rows))
            header = None
    return found


def stated(cell: str, config: HiResConfig) -> Any:
    """The default a table cell states, for `config`: `64 / hidden_size` with the outer norm, else `1.0`; `0.01`
    with experts, `0.0` dense; `intermediate_size` (with experts); `2 · hidden_size`; on; `None`..."""
    cell = re.sub(r" \([\d.]+\)$", "", cell)  # "`1 / initializer_range` (50)": the value at the defaults, said twice
    if match := re.fullmatch(r"(.+?) with the outer norm, else (.+)", cell):
        return stated(match[1] if config.outer_norm else match[2], config)
    if match := re.fullmatch(r"(.+?) with experts, (.+?) dense", cell):
        return stated(match[1] if config.num_experts else match[2], config)
    if match := re.fullmatch(r"(.+?) \(with experts\)", cell):
        return stated(match[1], config) if config.num_experts else None
    expression = cell.strip().strip("`")
    if expression in WORDS:
        return WORDS[expression]
    names = {"None": None, "True": True, "False": False, **vars(config)}
    return eval(expression.replace("·", "*"), {"__builtins__": {}}, names)


def documented_defaults() -> list[tuple[str, str, str, str]]:
    return [(page, header, field, cell) for page in PAGES for header, rows in tables(page) for field, cell in rows]


def test_the_pages_have_defaults_tables_covering_every_hires_field() -> None:
    """Every field HiRes has beyond Llama's is in architecture.md's tables; HiRes's own are in the README's."""
    documented = {page: {field for p, _, field, _ in documented_defaults() if p == page} for page in PAGES}
    beyond_llama = set(HiResConfig.__dataclass_fields__) - set(LlamaConfig.__dataclass_fields__)
    assert beyond_llama <= documented["docs/architecture.md"], sorted(beyond_llama - documented["docs/architecture.md"])
    hires_own = {"residual_size", "layers_per_block", "write_mode", "outer_norm", "projection_init", "skip_scale"}
    hires_own |= {"write_norm", "write_multiplier", "embedding_multiplier"}
    assert hires_own <= documented["README.md"], sorted(hires_own - documented["README.md"])


@pytest.mark.parametrize(
    "page, header, field, cell", documented_defaults(), ids=lambda v: v if "\n" not in str(v) else "?"
)
def test_a_documented_default_is_the_configs(page: str, header: str, field: str, cell: str) -> None:
    assert field in HiResConfig.__dataclass_fields__, f"{page} documents {field}, which HiResConfig does not have"
    shapes = SHAPES.items()
    if header == "default with the outer norm":
        shapes = [(name, shape) for name, shape in shapes if shape.get("outer_norm", True)]
    for name, shape in shapes:
        if field in shape:
            continue
        config = HiResConfig(**shape)
        if field not in DERIVED_DEFAULTS and name != "defaults":
            continue  # a plain field's default is the class's; the other shapes only move the derived ones
        assert stated(cell, config) == pytest.approx(getattr(config, field)), (
            f"{page}: `{field}` defaults to {cell!r}, which gives {stated(cell, config)!r} for the {name} config; "
            f"HiResConfig gives {getattr(config, field)!r}"
        )


def test_the_write_multipliers_base_width_in_prose_is_the_configs() -> None:
    """`write_multiplier` = 64/d (README), "`64` is `WRITE_BASE_WIDTH`", "base width 64 (0.5 at d=128)"."""
    text = "\n".join((ROOT / page).read_text() for page in PAGES)
    quoted = [int(n) for n in re.findall(r"`write_multiplier` = (\d+) ?/ ?(?:d|`hidden_size`)", text)]
    quoted += [int(n) for n in re.findall(r"`(\d+)` is `WRITE_BASE_WIDTH`", text)]
    assert quoted and set(quoted) == {WRITE_BASE_WIDTH}, quoted
    for base, value, width in re.findall(r"base width (\d+) \(([\d.]+) at d=(\d+)\)", text):
        assert int(base) == WRITE_BASE_WIDTH and float(value) == WRITE_BASE_WIDTH / int(width)
