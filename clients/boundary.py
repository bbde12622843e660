"""What crosses a node's boundary besides its replies: the request's numbers on the way in,
its error texts on the way out.

Why here and not in each handler: a server-sent NaN or inf reaches whatever handler the
server names, and an error text goes to the server whatever handler raised it, so both are
checked once, where the ClientApp runs a handler (``fl_app/client_app.py``), and a new
handler is covered without a line of its own.

- :func:`check_finite`: every floating-point number of the request (arrays and config
  values) must be finite; a refusal names the node and the field (``record.name``), never a
  value. A NaN model would otherwise surface as a library error deep inside the math
  ("scores contains NaN", naming no node) or be clipped into a sum.
- :func:`scrubbed`: the text of an error a handler raised, with every path of the node's
  own config (``identity-key``, ``roster``, ``data-dir``, ``dp-ledger``, ``lpgcn-init``)
  replaced by its key name, anything below one of them by ``<key>/...`` (which files a
  node's data directory holds, and how they are laid out, is the node's), and any other
  absolute path by ``<path>``. The node's operator still sees the full text in the node's
  own log (Flower's logger, INFO); the server (and the operator who reads its errors) never
  sees where a node keeps its keys or data.
- A data error (:class:`datasets.errors.DataError`: a malformed file of the node's) reaches
  the server as one fixed sentence naming the node and, where the error names one, the
  field of the file format at fault: never the file, the line or the value, which are the
  node's data (its operator's log has them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import RecordDict
from flwr.common.logger import log

#: Node config keys that hold paths on the node's own machine.
PATH_KEYS = ("identity-key", "roster", "data-dir", "dp-ledger", "lpgcn-init")
#: What may follow a node path in an error text and still be the same path (a file below it,
#: a suffix such as ``.lock``).
_BELOW = r"(?:[/.][\w.\-+@%]+)*/?"
#: An absolute path of at least two components (``/a/b``, ``/tmp/x.npz``), not part of a
#: word or a ratio such as ``1/sqrt(m)``.
_ABS_PATH = re.compile(r"(?<![\w)\]}.~>])/(?:[\w.\-+@%]+/)+[\w.\-+@%]*")
_HOME_PATH = re.compile(r"(?<![\w/])~/[\w.\-+@%/]*")


class NonFiniteRequest(ValueError):
    """A request carries NaN or inf where the node takes finite numbers only."""


def check_finite(content: RecordDict, who: str) -> None:
    """Refuse a request with a non-finite floating-point array or config value, naming the
    node and the first such field (``record.name``); never a value or a position."""
    for record_name, record in content.array_records.items():
        for name in record:
            array = record[name]
            if not _floating(array):  # integer masks, ids, bytes: finite by type
                continue
            if not _finite_array(array):
                raise _refusal(who, f"{record_name}.{name}")
    for record_name, config in content.config_records.items():
        for name, value in config.items():
            if not _finite_value(value):
                raise _refusal(who, f"{record_name}.{name}")


#: Values checked at a time: the check allocates at most this many booleans, never a copy.
_CHUNK = 1 << 20


def _finite_array(array: Any) -> bool:
    """Whether a Flower Array's values are all finite, read in place from its ``.npy``
    bytes (a view, chunk by chunk): the check must not cost the node a copy of what the
    server sent before the handler bounds it."""
    import io

    from numpy.lib import format as npy

    buf = io.BytesIO(array.data)
    major, _ = npy.read_magic(buf)
    read_header = npy.read_array_header_1_0 if major == 1 else npy.read_array_header_2_0
    shape, _, dtype = read_header(buf)  # (memory order does not matter element-wise)
    count = int(np.prod(shape, dtype=np.int64))
    values = np.frombuffer(array.data, dtype=dtype, count=count, offset=buf.tell())
    return all(bool(np.isfinite(values[i:i + _CHUNK]).all())
               for i in range(0, count, _CHUNK))


def _floating(array: Any) -> bool:
    from flwr.common.constant import SType

    try:
        return array.stype == SType.NUMPY and np.dtype(array.dtype).kind in "fc"
    except TypeError:
        return False


def _finite_value(value: Any) -> bool:
    if isinstance(value, float):
        return bool(np.isfinite(value))
    if isinstance(value, list):
        return all(not isinstance(v, float) or np.isfinite(v) for v in value)
    return True


def _refusal(who: str, field: str) -> NonFiniteRequest:
    return NonFiniteRequest(f"{who} refuses the request: field '{field}' holds non-finite "
                            "values (NaN or inf); expected finite numbers")


def _names(text: str, who: str) -> bool:
    """Whether ``text`` names the node: ``who`` is ``node <id>`` or ``node <id> (partition
    <p>)``, and handlers name either part."""
    node, _, partition = who.partition(" (")
    return re.search(rf"\b{re.escape(node)}\b", text) is not None or bool(
        partition and re.search(rf"\b{re.escape(partition.rstrip(')'))}\b", text))


def node_paths(node_config: Mapping[str, Any],
               data_config: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The paths of this node's own config (and the data directory the request named), by
    key: what :func:`scrubbed` replaces."""
    from datasets.sources import resolve_data_root

    out: dict[str, str] = {}
    for source in (data_config or {}, node_config):  # the node's own data-dir wins
        for key in PATH_KEYS:
            value = str(source.get(key, "") or "")
            if value:
                out[key] = value.rstrip("/") or value
    root = resolve_data_root(out.get("data-dir", ""))  # $FEDREC_DATA or the default
    if root is not None:
        out.setdefault("data-dir", str(root))
        if str(root) != out["data-dir"]:
            out["data-dir resolved"] = str(root)
    return out


def scrubbed(text: str, paths: Mapping[str, str]) -> str:
    """``text`` with each path in ``paths`` replaced by ``<key>`` (longest first, so a file
    under the data directory reads ``<data-dir>/ml-100k/u.data``) and any other absolute
    path by ``<path>``."""
    for key, path in sorted(paths.items(), key=lambda kv: -len(kv[1])):
        name = key.split()[0]
        text = re.sub(re.escape(path) + _BELOW,
                      lambda m, n=name, p=path: f"<{n}>" if m.group(0).rstrip("/") == p
                      else f"<{n}>/..." if m.group(0)[len(p)] == "/" else f"<{n}>...", text)
    text = _ABS_PATH.sub("<path>", text)
    return _HOME_PATH.sub("<path>", text)


def data_error_text(text: str, who: str) -> str:
    """What the server learns of a data error of the node's: that its data does not load,
    and the field of the format at fault if the error names one (``field 'rating'``)."""
    field = re.search(r"field '([\w\- ]+)'", text)
    what = f" (field '{field.group(1)}')" if field else ""
    return (f"{who} cannot load its data: a file under its data-dir is malformed{what}. Its "
            "operator's log has the file, the line and what is wrong there")


def scrub_exception(exc: BaseException, paths: Mapping[str, str], who: str) -> None:
    """Rewrite ``exc``'s text in place (its type and traceback stay) for the server: no
    path of the node, and the node named (a library or data error deep in a handler does
    not know it). The original goes to the node's own log when a path was removed."""
    from datasets.errors import DataError

    before = str(exc)
    args: Iterable[Any] = exc.args
    if isinstance(exc, DataError):
        args = (data_error_text(before, who),)
    exc.args = tuple(scrubbed(a, paths) if isinstance(a, str) else a for a in args)
    if isinstance(exc, OSError):  # its text shows ``filename`` beside the args
        for attr in ("filename", "filename2"):
            value = getattr(exc, attr, None)
            if isinstance(value, str):
                setattr(exc, attr, scrubbed(value, paths))
    if str(exc) != before:  # the node's own console keeps what the server does not see
        log(INFO, "%s (full text, not sent to the server): %s", who, before)
    if len(exc.args) == 1 and isinstance(exc.args[0], str) and not _names(exc.args[0], who):
        exc.args = (f"{who}: {exc.args[0]}",)
