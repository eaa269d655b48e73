"""The one markdown-table builder: exact text (results files are compared as text), alignment, and shape errors."""

import pytest

from hires_hf.tables import markdown_row, markdown_table


def test_table_lines_header_rule_and_rows_as_github_markdown():
    lines = markdown_table(["lr", "loss", "note"], [(0.001, "3.100", ""), ("2e-3", 2.9, "best")], align="rrl")
    assert lines == ["| lr | loss | note |", "|---:|---:|---|", "| 0.001 | 3.100 |  |", "| 2e-3 | 2.9 | best |"]


def test_default_alignment_is_text_and_rows_may_come_later():
    lines = markdown_table(["a", "b"])
    lines.append(markdown_row(["x", 1]))
    assert lines == ["| a | b |", "|---|---|", "| x | 1 |"]


@pytest.mark.parametrize(
    "header, rows, align",
    [(["a", "b"], [], "r"), (["a", "b"], [], "lc"), (["a", "b"], [("only one",)], ""), (["a"], [("x", "y")], "")],
    ids=["align-too-short", "align-unknown-letter", "row-too-short", "row-too-long"],
)
def test_mismatched_columns_are_errors_not_shifted_cells(header, rows, align):
    with pytest.raises(ValueError, match=r"columns|cells"):
        markdown_table(header, rows, align=align)
