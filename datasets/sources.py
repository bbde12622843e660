"""Locate a dataset's source files, so loading and cache keys agree on what was read.

Search order for the data root: spec.data_dir, then $FEDREC_DATA, then
<repo>/../shared/data. Inside the root a dataset lives in <root>/<name>/ or,
when the root itself holds the files, directly in <root>.
"""

from __future__ import annotations

import os
from pathlib import Path

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


def _folder(root: Path, name: str, marker: str) -> Path:
    """<root>/<name> if it exists, else <root> if it holds `marker`, else <root>/<name>."""
    sub = root / name
    if sub.is_dir() or not (root / marker).is_file():
        return sub
    return root


def _require(name: str, path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{name}: expected file {path} {_HINT}")
    return path


def locate(name: str, data_dir: str) -> dict[str, Path]:
    """Role -> path of the files `name` will read; raises FileNotFoundError if missing.

    ml-100k: u.data (required), u.user and u.item (optional: features, zip).
    gowalla/yelp2018: train.npz + test.npz, else train.txt + test.txt.
    lightgcn: train.txt + test.txt.
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
    if name in ("gowalla", "yelp2018"):
        folder = _folder(root, name, "train.npz")
        if not (folder / "train.npz").is_file() and (folder / "train.txt").is_file():
            return {
                "train_txt": _require(name, folder / "train.txt"),
                "test_txt": _require(name, folder / "test.txt"),
            }
        return {
            "train_npz": _require(name, folder / "train.npz"),
            "test_npz": _require(name, folder / "test.npz"),
        }
    if name == "lightgcn":
        folder = _folder(root, name, "train.txt")
        return {
            "train_txt": _require(name, folder / "train.txt"),
            "test_txt": _require(name, folder / "test.txt"),
        }
    raise ValueError(f"no source layout for dataset {name!r}")


def fingerprint(files: dict[str, Path]) -> list[tuple[str, str, int, int]]:
    """(role, absolute path, mtime_ns, size) per file: changes when a file changes."""
    out = []
    for role in sorted(files):
        st = files[role].stat()
        out.append((role, str(files[role].resolve()), st.st_mtime_ns, st.st_size))
    return out
