"""Locate a dataset's source files, so loading and cache keys agree on what was read.

Search order for the data root: spec.data_dir, then $FEDREC_DATA, then
<repo>/../shared/data. Inside the root a dataset lives in <root>/<name>/ or,
when the root itself holds the files, directly in <root>. Every dataset but synthetic,
ml-100k and ml-1m (gowalla, yelp2018, lightgcn and any other name: a user's own data) is a given
train/test split in one of :data:`SPLIT_FORMATS`, picked by the format its ``dataset.toml``
declares, else by the files present.
"""

from __future__ import annotations

import os
from pathlib import Path

from .folder_meta import META_FILE, read_meta
from .spec import KNOWN_DATASETS

_HINT = ("(simulation: run_simulation.py --data-dir or $FEDREC_DATA; a deployed SuperNode: "
         "--node-config \"data-dir='/path'\" or $FEDREC_DATA in its environment)")


def repo_root() -> Path:
    """The project checkout that contains this package."""
    return Path(__file__).resolve().parent.parent


def resolve_data_root(data_dir: str) -> Path | None:
    """The data root for a spec, or None when nothing is configured or found."""
    if data_dir:
        return Path(data_dir).expanduser()
    env = os.environ.get("FEDREC_DATA", "")
    if env:
        return Path(env).expanduser()
    shared = repo_root().parent / "shared" / "data"
    return shared if shared.is_dir() else None


def _root_or_fail(name: str, data_dir: str) -> Path:
    root = resolve_data_root(data_dir)
    if root is None:
        raise FileNotFoundError(f"{name}: no data directory configured {_HINT}")
    if not root.is_dir():
        raise FileNotFoundError(f"{name}: data directory {root} does not exist {_HINT}")
    return root


def _folder(root: Path, name: str, *markers: str) -> Path:
    """<root>/<name> if it exists, else <root> if it holds one of `markers`, else
    <root>/<name> (which then fails, naming it)."""
    sub = root / name
    if sub.is_dir() or not any((root / m).is_file() for m in markers):
        return sub
    return root


def _require(name: str, path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{name}: expected file {path} {_HINT}")
    return path


#: The file sets a given train/test split may come in, in the order they are tried:
#: role -> file name, and what the files hold (for the error that lists them all).
SPLIT_FORMATS: tuple[tuple[dict[str, str], str], ...] = (
    ({"train_npz": "train.npz", "test_npz": "test.npz"},
     "scipy sparse users x items matrices, as scipy.sparse.save_npz writes them"),
    ({"train_txt": "train.txt", "test_txt": "test.txt"},
     "text: LightGCN lists 'user item1 item2 ...', or pairs 'user item', or with "
     "dataset.toml format = \"ratings\" lines 'user item rating timestamp'"),
    ({"train_csv": "train.csv", "test_csv": "test.csv"},
     "CSV with a header naming the columns user, item and optionally rating, timestamp"),
)
#: Which file set each declarable format (``dataset.toml``) reads.
_FORMAT_FILES: dict[str, str] = {"npz": "train_npz", "csv": "train_csv", "lists": "train_txt",
                                 "pairs": "train_txt", "ratings": "train_txt"}
_SPLIT_HINT = ("one interactions file without a split? python -m datasets.make_split FILE "
               "--out FOLDER writes one (docs/datasets.md, 'Your own data')")


def accepted_file_sets() -> str:
    """Every accepted file set of a given split, for messages and docs."""
    return "; or ".join(f"{' + '.join(files.values())} ({what})" for files, what in SPLIT_FORMATS)


def split_files(name: str, root: Path) -> dict[str, Path]:
    """Role -> path of a given train/test split under <root>/<name>/ (or <root> itself when
    it holds the files), in the first format whose train file is present. An error names
    the folder, what is missing and every accepted file set."""
    folder = _folder(root, name, *(next(iter(files.values())) for files, _ in SPLIT_FORMATS))
    if not folder.is_dir():
        own = "" if name in KNOWN_DATASETS else (
            f" (a dataset other than {', '.join(KNOWN_DATASETS)} is a folder of your own data)")
        raise FileNotFoundError(
            f"{name}: folder {folder} does not exist{own}; expected it to hold "
            f"{accepted_file_sets()} {_HINT}")
    meta_path = folder / META_FILE
    declared = read_meta(meta_path).format if meta_path.is_file() else None
    for files, _ in SPLIT_FORMATS:
        if declared is not None and _FORMAT_FILES[declared] not in files:
            continue
        paths = {role: folder / fname for role, fname in files.items()}
        present = [p for p in paths.values() if p.is_file()]
        if not present:
            continue
        missing = [p.name for p in paths.values() if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{name}: {folder} holds {present[0].name} but not {', '.join(missing)}; "
                f"expected {accepted_file_sets()}")
        return {**paths, "meta": meta_path} if meta_path.is_file() else paths
    if declared is not None:
        wanted = next(files for files, _ in SPLIT_FORMATS if _FORMAT_FILES[declared] in files)
        raise FileNotFoundError(
            f"{name}: {META_FILE} declares format '{declared}', but {folder} does not hold "
            f"{' + '.join(wanted.values())}; {_SPLIT_HINT}")
    raise FileNotFoundError(
        f"{name}: no train/test split in {folder}; expected {accepted_file_sets()}; "
        f"{_SPLIT_HINT} {_HINT}")


def locate(name: str, data_dir: str) -> dict[str, Path]:
    """Role -> path of the files `name` will read; raises FileNotFoundError if missing.

    ml-100k: u.data (required), u.user and u.item (optional: features, zip).
    ml-1m: ratings.dat (required), users.dat and movies.dat (optional: features, zip).
    Any other name (gowalla, yelp2018, lightgcn, or a user's own): a given split,
    train.npz + test.npz, else train.txt + test.txt, else train.csv + test.csv, and the
    folder's dataset.toml (role ``meta``) when present (:func:`split_files`).
    """
    if name == "synthetic":
        return {}
    root = _root_or_fail(name, data_dir)
    if name == "ml-100k":
        folder = _folder(root, name, "u.data")
        files = {"ratings": _require(name, folder / "u.data")}
        for role, fname in (("users", "u.user"), ("items", "u.item")):
            if (folder / fname).is_file():
                files[role] = folder / fname
        return files
    if name == "ml-1m":
        folder = _folder(root, name, "ratings.dat")
        files = {"ratings": _require(name, folder / "ratings.dat")}
        for role, fname in (("users", "users.dat"), ("items", "movies.dat")):
            if (folder / fname).is_file():
                files[role] = folder / fname
        return files
    return split_files(name, root)


def fingerprint(files: dict[str, Path]) -> list[tuple[str, str, int, int]]:
    """(role, absolute path, mtime_ns, size) per file: changes when a file changes."""
    out = []
    for role in sorted(files):
        st = files[role].stat()
        out.append((role, str(files[role].resolve()), st.st_mtime_ns, st.st_size))
    return out
