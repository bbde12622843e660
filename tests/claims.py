"""Every result a doc quotes is in a results file: the numbers check behind
tests/test_docs_claims.py.

A number *looks like a result* when it has three significant digits or more (``0.355``,
``15.6``, ``2,048``, ``17.4%``), is a ratio of two or more (``2.76x``, ``24x``), or is a
count ``N of M``. Each one a doc quotes must be

- in a results file the doc points to: the JSON / Markdown files under ``results/`` that
  its paragraph (a blank-line block, or one list item) names, else those its section
  names, else those its protocol owns (``docs/protocols/<x>.md``: its ``results/<x>/``);
  a paragraph of another doc that names no file has none (with every results file in
  play, almost any three-decimal number turns up in some curve); a file named in one form (``results/a/b.md``,
  ``results/a/b.{json,md}``, ``results/a/<dataset>.md``, ``results/a/``) brings its
  siblings of the same stem. Compared after rounding to the precision quoted (``0.355``
  matches 0.35549, a percentage matches its fraction too), a count's two numbers in
  one file;
- or in docs/reproduction.md's rows of the doc's paper (every row for a doc that is
  not one protocol's), where the paper's numbers and ours sit side by side;
- or marked as the paper's: the first number after ``paper``, ``paper's``,
  ``papers'``, ``published`` or ``reported`` (at most 30 characters on, no other number,
  no ``;`` and no sentence end between), and numbers chained to it by ``/``, ``,``,
  ``-`` or ``to``;
- or a setting: a phrase of ``docs/claims_allow.txt`` (``phrase :: reason``) that
  contains the number where it stands. That file lists parameters and settings, never a
  result.

A citation's year (``Mironov 2012)``) is not a result. Code (fenced blocks and `inline
code`), link targets, HTML comments and numbers inside names (``ML-100K``, ``Yelp2018``, ``k_sweep``) are not read.

``python -m tests.claims [FILE...]`` prints what it flags (default: every checked doc).
"""

from __future__ import annotations

import bisect
import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
REPORT = REPO / "docs" / "reproduction.md"
ALLOW = REPO / "docs" / "claims_allow.txt"
#: results folders that are not results (ad-hoc runs, a user's own boards)
NOT_RESULTS = ("runs", "boards")
#: docs/protocols/<x>.md -> (its results folders, its paper's section in the report)
PROTOCOL_DOCS = {
    "privirec": (("privirec",), "000"),
    "lpgcn": (("lpgcn",), "001"),
    "fedsvd": (("fedsvd",), "002"),
    "dp-prototypes": (("dp_prototypes", "dp_curves"), "003"),
    "mvmf": (("mvmf",), "004"),
    "fedmf": (("fedmf",), None),
}

_NUM = re.compile(
    r"(?<![\w.,/#@^])(?<![A-Za-z]-)(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?"
    r"(?:[eE](?P<exp>[-+]?\d+))?(?P<suffix>x|%)?(?![\w]|[.,]\d)")
_COUNT = re.compile(r"(?<![\w.,])(\d[\d,]*) of (\d[\d,]*)(?![\w.,]\d)")
_MARKER = re.compile(r"\b(?:paper(?:'s|s'|s)?|published|reported)(?!\w)", re.I)
_REF = re.compile(r"(?:Table|Tables|Fig\.|Figs\.|Figure|Eq\.|Eqs\.|section|sections|§|"
                  r"Theorem|Algorithm|Approximation|Lemma|digest|issue|step|steps|"
                  r"epoch|seed|L =|p =)\s*$", re.I)
#: a citation's year: "Mironov 2012)", "Bell et al. 2020)", "Appl. Sci. 2023.", "(CKS 2020)"
_CITATION_YEAR = re.compile(r"(?:\bet al\.|\b[A-Z][A-Za-z]*\.?)\s+(?:19[5-9]\d|20[0-3]\d)(?=[),;.])")
_CHAIN = re.compile(r"^\s*(?:/|,|-|–|to|and)?\s*$")
_CITE = re.compile(r"results/[\w./{},<>*-]*[\w/}>*]")


@dataclass(frozen=True)
class Flag:
    path: str
    line: int
    text: str
    context: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}  ...{self.context}..."


# -- the values in results files -------------------------------------------------------

def _numbers_in_text(text: str) -> list[float]:
    out = []
    for m in re.finditer(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?", text):
        s = m.group().replace(",", "")
        try:
            out.append(abs(float(s)))
        except ValueError:
            pass
    return out


def _walk(obj: object, out: list[float]) -> None:
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        out.append(abs(float(obj)))
    elif isinstance(obj, str):
        out.extend(_numbers_in_text(obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(_numbers_in_text(str(k)))
            _walk(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _walk(v, out)


@lru_cache(maxsize=None)
def values(path: Path) -> tuple[float, ...]:
    """Every number in one results file (JSON: every value and key; Markdown: its text),
    sorted, as absolute values."""
    text = path.read_text(encoding="utf-8", errors="replace")
    out: list[float] = []
    if path.suffix == ".json":
        try:
            _walk(json.loads(text), out)
        except json.JSONDecodeError:
            out = _numbers_in_text(text)
    else:
        out = _numbers_in_text(text)
    return tuple(sorted(v for v in out if v == v))


def results_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.suffix in (".json", ".md")
                  and p.relative_to(RESULTS).parts[0] not in NOT_RESULTS)


def _expand_braces(s: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", s)
    if not m:
        return [s]
    return [x for alt in m.group(1).split(",")
            for x in _expand_braces(s[:m.start()] + alt + s[m.end():])]


def cited(text: str) -> set[Path]:
    """The results files ``text`` names, with their siblings of the same stem."""
    found: set[Path] = set()
    for raw in _CITE.findall(text):
        for name in _expand_braces(raw.rstrip(".,;:")):
            pattern = re.sub(r"<[^>]*>", "*", name)
            rel = pattern[len("results/"):]
            if not rel or pattern.endswith("/"):
                hits = [p for p in RESULTS.glob(rel.rstrip("/") + "/**/*")] if rel else []
            else:
                stem = re.sub(r"\.(json|md|png|npz)$", "", rel)
                hits = list(RESULTS.glob(stem + ".*")) + list(RESULTS.glob(stem + "/**/*"))
            found.update(p for p in hits if p.suffix in (".json", ".md") and
                         p.relative_to(RESULTS).parts[0] not in NOT_RESULTS)
    return found


@lru_cache(maxsize=None)
def report_values(paper: str | None) -> tuple[float, ...]:
    """The numbers of docs/reproduction.md's rows of ``paper`` (every row for None)."""
    text = REPORT.read_text(encoding="utf-8")
    if paper is not None:
        parts = re.split(r"^## ", text, flags=re.M)
        text = "\n".join(p for p in parts if p.startswith(f"{paper}:"))
    return tuple(sorted(_numbers_in_text(text)))


# -- the numbers a doc quotes ----------------------------------------------------------

def _blank(m: re.Match) -> str:
    return re.sub(r"[^\n]", " ", m.group())


def readable(text: str) -> str:
    """``text`` with what is not prose blanked out (same length, same lines)."""
    text = re.sub(r"<!--.*?-->", _blank, text, flags=re.S)
    text = re.sub(r"^[ \t]*(```|~~~).*?^[ \t]*\1", _blank, text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*(?:\n[^`\n]*)?`", _blank, text)
    text = re.sub(r"\]\([^)\s]*\)", _blank, text)
    text = re.sub(r"https?://\S+", _blank, text)
    return text


def units(text: str) -> list[tuple[int, int, int]]:
    """(start, end, section start) of each paragraph or list item of ``text``."""
    out, start, section = [], 0, 0
    pos = 0
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        new_item = re.match(r"\s*(?:[-*+]|\d+\.)\s", line) is not None
        heading = line.startswith("#")
        if not stripped or new_item or heading:
            if pos > start:
                out.append((start, pos, section))
            start = pos if stripped else pos + len(line)
            if heading:
                section = pos
        pos += len(line)
    if pos > start:
        out.append((start, pos, section))
    return out


def sig_digits(m: re.Match) -> int:
    digits = m.group("int").replace(",", "")
    if m.group("frac"):
        return len((digits + m.group("frac")[1:]).lstrip("0"))
    return len(digits.strip("0"))


def is_result(m: re.Match) -> bool:
    if m.group("suffix") == "x":
        return sig_digits(m) >= 2
    return sig_digits(m) >= 3


def _quoted(m: re.Match) -> tuple[float, float]:
    """(value, half-width of the rounding the quote implies)."""
    s = m.group("int").replace(",", "") + (m.group("frac") or "")
    exp = int(m.group("exp") or 0)
    decimals = len(m.group("frac") or ".") - 1
    return float(s) * 10.0 ** exp, 0.5 * 10.0 ** (exp - decimals) * (1 + 1e-9)


def _found(value: float, half: float, pool: tuple[float, ...]) -> bool:
    i = bisect.bisect_left(pool, value - half - 1e-12)
    return i < len(pool) and pool[i] <= value + half + 1e-12


@lru_cache(maxsize=None)
def allowances() -> tuple[tuple[str, str], ...]:
    """(phrase, reason) of each line of docs/claims_allow.txt."""
    if not ALLOW.exists():
        return ()
    out = []
    for line in ALLOW.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            phrase, sep, reason = line.partition("::")
            if not sep or not phrase.strip() or not reason.strip():
                raise ValueError(f"{ALLOW}: every line is 'phrase :: reason': {line!r}")
            out.append((" ".join(phrase.split()), reason.strip()))
    return tuple(out)


def allowed_phrases() -> tuple[str, ...]:
    return tuple(p for p, _ in allowances())


def untested_allowances() -> list[str]:
    """Allowed phrases whose reason says ``tested in tests/<file>.py`` but whose numbers
    (each result-like one, as digits) that file does not hold."""
    bad = []
    for phrase, reason in allowances():
        m = re.match(r"tested in (tests/[\w/]+\.py)", reason)
        if not m:
            continue
        test = REPO / m.group(1)
        code = re.sub(r"(?<=\d)[_,](?=\d)", "", test.read_text()) if test.exists() else ""
        for n in _NUM.finditer(phrase):
            if is_result(n) and n.group().replace(",", "") not in code:
                bad.append(f"{phrase} ({n.group()} not in {m.group(1)})")
    return bad


def unused_allowances(paths: list[Path]) -> list[str]:
    """Allowed phrases no checked doc contains (a stale line)."""
    prose = " ".join(" ".join(readable(p.read_text(encoding="utf-8")).split()) for p in paths)
    return [p for p in allowed_phrases() if p not in prose]


def _allowed(unit: str, start: int, end: int) -> bool:
    """Whether an allowed phrase covers ``unit[start:end]``."""
    for phrase in allowed_phrases():
        pattern = r"\s+".join(re.escape(w) for w in phrase.split())
        for m in re.finditer(pattern, unit):
            if m.start() <= start and m.end() >= end:
                return True
    return False


def _paper_marked(unit: str, nums: list[re.Match]) -> set[int]:
    """Indexes of ``nums`` (matches in ``unit``) that are the paper's."""
    marked: set[int] = set()
    for mk in _MARKER.finditer(unit):
        for i, m in enumerate(nums):
            if m.start() < mk.end():
                continue
            between = unit[mk.end():m.start()]
            if len(between) <= 30 and ";" not in between and \
                    not re.search(r"\d", between) and \
                    not re.search(r"[.!?]\s+[A-Z(]", between):
                marked.add(i)
                j = i
                while j + 1 < len(nums) and _CHAIN.match(unit[nums[j].end():nums[j + 1].start()]):
                    j += 1
                    marked.add(j)
            break
    return marked


def _protocol(path: Path) -> tuple[tuple[str, ...], str | None] | None:
    if path.parent.name == "protocols":
        return PROTOCOL_DOCS.get(path.stem)
    return None


def check(path: Path, text: str | None = None) -> list[Flag]:
    """The result-like numbers of one doc found nowhere they may come from."""
    raw = path.read_text(encoding="utf-8") if text is None else text
    prose = readable(raw)
    proto = _protocol(path)
    own = {p for folder in (proto[0] if proto else ()) for p in results_files()
           if p.relative_to(RESULTS).parts[0] == folder}
    report = report_values(proto[1] if proto else None)
    flags: list[Flag] = []
    sections: dict[int, set[Path]] = {}
    spans = units(prose)
    for start, end, section in spans:
        # citations are read from the raw text: they usually sit in `code`
        if section not in sections:
            sec_end = next((s for s, _, sec in spans if sec > section), len(raw))
            sections[section] = cited(raw[section:sec_end])
        files = cited(raw[start:end]) or sections[section] or own
        unit = prose[start:end]
        nums = [m for m in _NUM.finditer(unit)
                if not _REF.search(unit[max(0, m.start() - 16):m.start()])]
        paper = _paper_marked(unit, nums)
        for i, m in enumerate(nums):
            if not is_result(m) or i in paper or any(
                    y.end() == m.end() for y in _CITATION_YEAR.finditer(
                        unit, max(0, m.start() - 40), m.end() + 1)):
                continue
            if _allowed(unit, m.start(), m.end()):
                continue
            value, half = _quoted(m)
            pools = [values(f) for f in files] + [report]
            if m.group("suffix") == "%":
                pools += [tuple(v * 100 for v in p) for p in pools]
            if not any(_found(value, half, p) for p in pools):
                flags.append(_flag(path, raw, start + m.start(), m.group()))
        for c in _COUNT.finditer(unit):
            a, b = (float(g.replace(",", "")) for g in c.groups())
            if not any(_found(a, 0.5, values(f)) and _found(b, 0.5, values(f))
                       for f in files):
                if not _allowed(unit, c.start(), c.end()):
                    flags.append(_flag(path, raw, start + c.start(), c.group()))
    return flags


def _flag(path: Path, raw: str, at: int, text: str) -> Flag:
    line = raw.count("\n", 0, at) + 1
    ctx = " ".join(raw[max(0, at - 50):at + len(text) + 30].split())
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return Flag(str(rel), line, text, ctx)


#: the docs the check reads (docs/reproduction.md is generated from results/)
def checked_docs() -> list[Path]:
    docs = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md")) + \
        sorted((REPO / "docs" / "protocols").glob("*.md"))
    return [d for d in docs if d != REPORT]


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or checked_docs()
    flags = [f for p in paths for f in check(p)]
    for f in flags:
        print(f)
    print(f"{len(flags)} flagged in {len(paths)} file(s)", file=sys.stderr)
    return 1 if flags else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
