"""Split one interactions file into the train/test files a folder dataset is read from.

    python -m datasets.make_split FILE --out DIR [--method random|last] [--test-ratio 0.2]
        [--seed 0] [--format F] [--ids MODE] [--min-rating R] [--force]

Why a command: the loader uses a folder's split as given (``test-ratio`` does not apply),
so one file of all interactions needs a split written once, reproducibly, that every node
and the centralized reference then read alike. It reads FILE with the same readers and
checks as the loader (``datasets/readers.py``), keeps the last of a duplicated (user, item)
pair, and writes ``DIR/train.csv``, ``DIR/test.csv`` (header ``user,item[,rating]
[,timestamp]``, ids as written in FILE) and ``DIR/dataset.toml`` (format and ids).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from . import ids, readers
from .errors import DataError
from .folder_meta import ID_MODES, META_FILE
from .split import test_counts

METHODS = ("random", "last")


def detect_format(path: Path) -> str:
    """A single file's format: ``.csv`` is csv, any other name by the text rule."""
    if path.suffix.lower() == ".csv":
        return "csv"
    return readers.detect_text_format([path], "with --format ratings or --format lists")


def _groups(rec: readers.Records) -> tuple[np.ndarray, np.ndarray]:
    """Each record's user index (0..U-1) and each user's record count."""
    _, group, counts = np.unique(rec.users, return_inverse=True, return_counts=True)
    return group, counts


def dedupe(rec: readers.Records) -> readers.Records:
    """The interactions, each (user, item) pair once, keeping its last line (as the loader
    does), in file order; a listed user without items is no interaction."""
    rec = rec.subset(rec.items >= 0)
    pairs = np.stack([rec.users, rec.items], axis=1)[::-1]
    _, first_from_end = np.unique(pairs, axis=0, return_index=True)
    return rec.subset(np.sort(len(rec.users) - 1 - first_from_end))


def split_random(rec: readers.Records, test_ratio: float, seed: int) -> np.ndarray:
    """Test mask: per user, round(test_ratio * n) random interactions (>= 1 in test and
    >= 1 in train for a user with >= 2), the same for the same seed."""
    if not 0.0 < test_ratio < 1.0:
        raise ValueError(f"--test-ratio must be in (0, 1), got {test_ratio}")
    group, counts = _groups(rec)
    n_test = test_counts(counts, test_ratio)
    order = np.lexsort((np.random.default_rng(seed).random(len(group)), group))
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(group), dtype=np.int64)
    rank[order] = np.arange(len(group)) - start[group[order]]
    return rank < n_test[group]


def split_last(rec: readers.Records) -> np.ndarray:
    """Test mask: per user with >= 2 interactions, the latest by timestamp (of equal
    timestamps, the later line)."""
    if rec.times is None:
        raise DataError(f"{rec.label}: --method last needs a timestamp per interaction; "
                        f"format '{rec.fmt}' has none (use 'ratings', or csv with a "
                        "timestamp column, or --method random)")
    group, counts = _groups(rec)
    order = np.lexsort((np.arange(len(group)), rec.times, group))
    last = order[np.cumsum(counts) - 1]
    mask = np.zeros(len(group), dtype=bool)
    mask[last[counts >= 2]] = True
    return mask


def _cell(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def write_csv(path: Path, rec: readers.Records) -> None:
    """``user,item[,rating][,timestamp]`` with a header, the loader's csv format."""
    extra = [(name, a) for name, a in (("rating", rec.ratings), ("timestamp", rec.times))
             if a is not None]
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(",".join(["user", "item", *(name for name, _ in extra)]) + "\n")
        for k in range(len(rec.users)):
            cells = [str(rec.users[k]), str(rec.items[k]), *(_cell(a[k]) for _, a in extra)]
            fh.write(",".join(cells) + "\n")


def make_split(path: Path, out: Path, method: str = "random", test_ratio: float = 0.2,
               seed: int = 0, fmt: str | None = None, id_mode: str = "detect",
               min_rating: float | None = None, force: bool = False) -> str:
    """Read ``path``, split it, write the folder ``out``; returns the summary line."""
    targets = [out / "train.csv", out / "test.csv", out / META_FILE]
    if not force and any(t.exists() for t in targets):
        raise FileExistsError(f"{out} already holds a split; pass --force to replace it")
    fmt = fmt or detect_format(path)
    rec = readers.read(path, fmt)
    read = rec.n_interactions
    rec = dedupe(rec)
    if min_rating is not None:
        if rec.ratings is None:
            raise DataError(f"{rec.label}: --min-rating needs ratings; format '{fmt}' has none")
        rec = rec.subset(rec.ratings >= min_rating)
    idmap = ids.resolve([rec], id_mode)
    mask = split_last(rec) if method == "last" else split_random(rec, test_ratio, seed)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "train.csv", rec.subset(~mask))
    write_csv(out / "test.csv", rec.subset(mask))
    (out / META_FILE).write_text(
        f"# written by python -m datasets.make_split from {path.name}\n"
        f"format = \"csv\"\nids = \"{idmap.mode}\"\n", encoding="utf-8")
    n_users = len(np.unique(rec.users))
    how = "leave-last-out by timestamp" if method == "last" else (
        f"per-user random, test-ratio {test_ratio}, seed {seed}")
    return (f"{rec.label} ({fmt}): {read:,} interactions read, {len(rec.users):,} kept "
            f"(duplicates{' and ratings below min-rating' if min_rating is not None else ''}"
            f" dropped), {n_users:,} users, {idmap.describe()}; split {how}: "
            f"{int((~mask).sum()):,} train + {int(mask.sum()):,} test, "
            f"{len(np.unique(rec.users[mask])):,} users with a test item; wrote {out}/")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m datasets.make_split",
        description="Split one interactions file into DIR/train.csv, DIR/test.csv and "
                    "DIR/dataset.toml, the folder dataset run_simulation.py --dataset reads.")
    parser.add_argument("file", type=Path, help="the interactions file")
    parser.add_argument("--out", type=Path, required=True,
                        help="the dataset folder to write, <data-dir>/<name>")
    parser.add_argument("--method", choices=METHODS, default="random",
                        help="random: per-user random holdout (seeded); last: each user's "
                             "latest interaction by timestamp (default random)")
    parser.add_argument("--test-ratio", type=float, default=0.2,
                        help="random: the share of each user's interactions in test (0.2)")
    parser.add_argument("--seed", type=int, default=0, help="random: the seed (0)")
    parser.add_argument("--format", choices=tuple(readers.FORMATS), default=None,
                        help="the file's format (default: .csv is csv, else detected)")
    parser.add_argument("--ids", choices=ID_MODES, default="detect",
                        help="how ids become rows and columns (default detect)")
    parser.add_argument("--min-rating", type=float, default=None,
                        help="drop interactions rated below this before splitting")
    parser.add_argument("--force", action="store_true", help="replace an existing split")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry; a bad input prints its error and returns 2."""
    args = parse_args(argv)
    try:
        print(make_split(args.file, args.out, args.method, args.test_ratio, args.seed,
                         args.format, args.ids, args.min_rating, args.force))
    except (DataError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
