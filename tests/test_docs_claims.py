"""Every number README.md and docs/ quote that looks like a result is in a results file the
paragraph names, in docs/reproduction.md's rows of its paper, marked as the paper's, or a
setting listed with its reason in docs/claims_allow.txt (the rules: tests/claims.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import claims

REPO = claims.REPO


@pytest.mark.parametrize("doc", claims.checked_docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_result_a_doc_quotes_is_in_a_results_file(doc: Path) -> None:
    flags = claims.check(doc)
    assert not flags, "numbers no results file holds (trace each to its file and correct " \
        "it, or drop the claim):\n" + "\n".join(map(str, flags))


def test_the_checked_docs_are_the_readme_and_docs_but_not_the_generated_report() -> None:
    docs = {str(p.relative_to(REPO)) for p in claims.checked_docs()}
    assert "docs/protocols/fedmf.md" in docs
    assert "README.md" in docs and "docs/reproduction.md" not in docs


def test_every_allowed_phrase_has_a_reason_is_used_and_is_tested_where_it_says() -> None:
    assert claims.allowances(), "docs/claims_allow.txt is empty or gone"
    assert claims.untested_allowances() == []
    assert claims.unused_allowances(claims.checked_docs()) == []


def _doc(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "docs" / "protocols" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _flagged(path: Path) -> list[str]:
    return [f.text for f in claims.check(path)]


def test_the_check_sees_a_number_of_a_replaced_run(tmp_path: Path) -> None:
    """The L = 2 figures a replaced run gave are in no file the paragraph names (0.0528 is a
    Table 4 number of another paper, 0.1555 a synthetic baseline: a check over every
    results file would have passed them)."""
    doc = _doc(tmp_path, "privirec.md", "At L = 2 GF-CF reached 0.0528 and BSPM-EM 0.1555; "
               "at L = 2, p = r, 0.0539 and 0.1552 (`results/privirec/l_sweep.md`).\n")
    assert _flagged(doc) == ["0.0528", "0.1555"]


def test_the_check_sees_a_count_no_file_holds(tmp_path: Path) -> None:
    doc = _doc(tmp_path, "lpgcn.md", "The sampled draw has 103 of 135 real holdings named "
               "(`results/lpgcn/structure.md`).\n")
    assert "103 of 135" in _flagged(doc)


def test_a_number_is_read_at_its_quoted_precision(tmp_path: Path) -> None:
    """0.2117 in the file: 0.212 matches, 0.211 does not; a ratio quoted as a percentage of
    its fraction matches too."""
    doc = _doc(tmp_path, "fedmf.md", "Popularity 0.212, not 0.211, and 0.2117 "
               "(`results/fedmf/ml-100k.md`).\n")
    assert _flagged(doc) == ["0.211"]


def test_the_papers_numbers_and_settings_pass(tmp_path: Path) -> None:
    doc = _doc(tmp_path, "privirec.md", "Ours 0.1594 (paper 0.1789 / 0.1788), "
               "Python 3.11-3.12 (`results/privirec/gowalla.md`).\n")
    assert _flagged(doc) == []
    doc.write_text("Ours 0.1594, 0.1789 (`results/privirec/gowalla.md`); Python 3.17.\n")
    assert _flagged(doc) == ["0.1789", "3.17"]


def test_code_and_names_are_not_read(tmp_path: Path) -> None:
    doc = _doc(tmp_path, "privirec.md", "ML-100K and Yelp2018 (`--set privirec-k=1234`)\n\n"
               "```bash\npython x.py --rounds 12345\n```\n")
    assert _flagged(doc) == []


def test_a_citations_year_is_not_a_result_but_a_count_is(tmp_path: Path) -> None:
    doc = _doc(tmp_path, "privirec.md", "Samplers (Mironov 2012), graphs (Bell et al. "
               "2020); it took 2012 runs (`results/privirec/gowalla.md`).\n")
    assert _flagged(doc) == ["2012"]
