"""Error type for malformed data, so callers can tell bad input from bugs, and the finiteness
checks every reader applies (a NaN rating would otherwise pass every threshold and, with
``implicit = true``, become an interaction)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class DataError(ValueError):
    """A data file or data-derived value is malformed.

    Subclasses ValueError so generic "bad input" handlers still catch it, while
    the message always names the file and the line or field at fault.
    """


def first_non_finite(values: np.ndarray) -> int | None:
    """Index of the first NaN/inf in ``values`` (vectorised), or None when all are finite."""
    values = np.asarray(values)
    if values.dtype.kind not in "fc" or values.size == 0:
        return None
    finite = np.isfinite(values.ravel())
    return None if finite.all() else int(np.argmin(finite))


def data_line(path: Path, index: int, encoding: str) -> int:
    """1-based number of the ``index``-th (0-based) non-blank line of ``path``.

    Only called once a value is known to be bad, so the happy path never scans twice.
    """
    with open(path, encoding=encoding) as fh:
        seen = -1
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                seen += 1
                if seen == index:
                    return lineno
    raise DataError(f"{path}: has fewer than {index + 1} data lines")


def require_finite_lines(values: np.ndarray, path: Path, field: str, expected: str,
                         encoding: str = "utf-8") -> None:
    """Raise naming the file, the line and the field when a per-line value is NaN or inf
    (``values[i]`` read from the i-th non-blank line). Never prints a value."""
    bad = first_non_finite(values)
    if bad is not None:
        line = data_line(path, bad, encoding)
        raise DataError(f"{path} line {line}: field '{field}' is not finite (NaN or inf); "
                        f"expected {expected}")


def require_finite_array(values: np.ndarray, path: Path, name: str) -> None:
    """Raise naming the file and the array when a stored array holds NaN or inf."""
    if first_non_finite(values) is not None:
        raise DataError(f"{path}: array '{name}' has non-finite values (NaN or inf); "
                        "expected finite numbers")
