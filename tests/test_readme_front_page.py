"""README.md is a front page: under 120 lines, its tables render as written (every row has
the header's cells, no stray ``|`` splits a cell, no row falls out of its table), and every
link it gives leads to a file, and to a heading there where it names one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 120


def source_cells(row: str) -> list[str]:
    """A table row's cells as GitHub's Markdown splits them: on every ``|`` not escaped by a
    backslash, code spans included."""
    body = row.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return [c.strip() for c in re.split(r"(?<!\\)\|", body)]


def table_problems(text: str) -> list[str]:
    """What is wrong with the Markdown tables of ``text`` (empty: nothing)."""
    problems = []
    lines = text.splitlines()
    blocks: list[tuple[int, list[str]]] = []  # (first line number, lines) outside code
    in_code, current, start = False, [], 0
    for n, line in enumerate(lines + [""], 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if not in_code and line.lstrip().startswith("|"):
            if not current:
                start = n
            current.append(line)
            continue
        if current:
            blocks.append((start, current))
            current = []
    rendered = _rendered_tables(text)
    if len(rendered) != len(blocks):
        problems.append(f"{len(blocks)} table blocks in the source, {len(rendered)} rendered")
    for (start, block), table in zip(blocks, rendered):
        header = source_cells(block[0])
        if len(block) < 2 or not re.fullmatch(r"\|?(\s*:?-+:?\s*\|)*\s*:?-+:?\s*\|?",
                                               block[1].strip()):
            problems.append(f"line {start}: no delimiter row under the header")
            continue
        if len(source_cells(block[1])) != len(header):
            problems.append(f"line {start + 1}: delimiter row has "
                            f"{len(source_cells(block[1]))} cells, header {len(header)}")
        for i, row in enumerate(block[2:], start + 2):
            cells = source_cells(row)
            if len(cells) != len(header):
                problems.append(f"line {i}: {len(cells)} cells against the header's "
                                f"{len(header)} (a stray '|'? escape it as '\\|')")
        if len(table) != len(block) - 1:
            problems.append(f"line {start}: {len(block) - 1} rows in the source, "
                            f"{len(table)} rendered")
        for i, row in enumerate(table):
            if len(row) != len(header):
                problems.append(f"table at line {start}, rendered row {i}: {len(row)} cells")
    return problems


def _rendered_tables(text: str) -> list[list[list[str]]]:
    """Each table as markdown-it (CommonMark with GitHub's tables) renders it: rows of cells."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    tables: list[list[list[str]]] = []
    for tok in tokens:
        if tok.type == "table_open":
            tables.append([])
        elif tok.type == "tr_open":
            tables[-1].append([])
        elif tok.type in ("th_open", "td_open"):
            tables[-1][-1].append("")
    return tables


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_readme_is_a_front_page() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n < MAX_LINES, f"README.md has {n} lines; the front page stays under {MAX_LINES}"


def test_the_readme_tables_render_as_written() -> None:
    text = README.read_text(encoding="utf-8")
    assert "| `protocol` |" in text, "README lost its protocol table"
    assert table_problems(text) == []


def test_each_protocol_is_one_short_row() -> None:
    text = README.read_text(encoding="utf-8")
    rows = [r for r in text.splitlines() if r.startswith("| `") and "docs/protocols/" in r]
    assert len(rows) >= 6, rows
    for row in rows:
        assert len(row) < 400, f"a protocol row runs {len(row)} characters: {row[:80]}..."


@pytest.mark.parametrize("bad", [
    "| a | b |\n|---|---|\n| ||P-P*||_F | x |\n",  # an unescaped norm splits the cell
    "| a | b |\n|---|---|\n| x | y | z |\n",
    "| a | b |\n|---|---|\n| x |\n",
    "| a | b |\n|---|\n| x | y |\n",
])
def test_the_table_check_fails_on_a_broken_row(bad: str) -> None:
    assert table_problems(bad)


def test_the_table_check_passes_an_escaped_pipe() -> None:
    assert table_problems("| a | b |\n|---|---|\n| \\|\\|P-P*\\|\\|_F | x |\n") == []


def test_every_readme_link_leads_somewhere() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"https?://", link):
            continue
        path, _, anchor = link.partition("#")
        target = REPO / path
        assert target.exists(), f"README links to {path}, which does not exist"
        if anchor:
            headings = [slug(h) for h in re.findall(r"^#+ (.+)$", target.read_text(
                encoding="utf-8"), flags=re.M)]
            assert anchor in headings, f"{path} has no heading #{anchor}"


def test_the_slug_is_githubs() -> None:
    assert slug("000: PriviRec / PriviRec-k (secure federated graph filtering)") == \
        "000-privirec--privirec-k-secure-federated-graph-filtering"
