"""A folder dataset's own declaration, ``<data-dir>/<name>/dataset.toml``: format and ids.

Why a file in the folder: the format of the files belongs to whoever wrote them, so it
travels with them (a node's operator copies the folder, not a config line), and it is the
operator's, like the files, never the server's.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError
from .readers import FORMATS, label

META_FILE = "dataset.toml"
#: Formats a folder may declare: the text formats and ``npz`` (scipy matrices).
DECLARABLE_FORMATS: tuple[str, ...] = (*FORMATS, "npz")
#: How ids become rows and columns: found from the data, 0- or 1-based as written, or
#: remapped to 0..n-1 in id order (for sparse ids from another system).
ID_MODES: tuple[str, ...] = ("detect", "0-based", "1-based", "remap")


@dataclass(frozen=True)
class FolderMeta:
    """What ``dataset.toml`` declares; ``format`` None means detected from the files."""

    format: str | None = None
    ids: str = "detect"


def _choice(path: Path, key: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise DataError(f"{label(path)}: key '{key}' must be one of "
                        f"{', '.join(repr(c) for c in choices)}")
    return value


def read_meta(path: Path) -> FolderMeta:
    """The declaration in ``path``; unknown keys and values are refused, naming the key."""
    try:
        with open(path, "rb") as fh:
            table = tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{label(path)}: not valid TOML ({exc}); expected lines like "
                        "format = \"ratings\"") from None
    unknown = sorted(set(table) - {"format", "ids"})
    if unknown:
        raise DataError(f"{label(path)}: unknown key(s) {', '.join(unknown)}; expected "
                        "format and/or ids")
    fmt = table.get("format")
    meta = FolderMeta(
        format=None if fmt is None else _choice(path, "format", fmt, DECLARABLE_FORMATS),
        ids=_choice(path, "ids", table.get("ids", "detect"), ID_MODES))
    if meta.format == "npz" and meta.ids != "detect":
        raise DataError(f"{label(path)}: key 'ids' does not apply to format 'npz' (its rows "
                        "and columns are the ids)")
    return meta
