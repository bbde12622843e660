"""One piece of array math for numpy arrays and torch tensors: the few operations LightGCN's
math needs that the two libraries spell differently, dispatched on the argument's type.

Why: LightGCN (``fedrec/recsys/lightgcn.py``) is written once, with hand-formed gradients
the LP-GCN nodes compute in parts; numpy is its reference and what crosses the wire, torch
lets the same math run on an accelerator (``device``: ``"cpu"``, ``"cuda"``, ``"cuda:1"``).
Every other operation the math uses (``+``, ``*``, ``@`` with a dense right-hand side,
``x[:, None]``, ``.sum()``) means the same on both. torch is imported on first use, so a
numpy-only node never pays its import.

On CPU in float64 the torch path equals the numpy path to rounding (the sums run in another
order): ``tests/test_lightgcn_device.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

if TYPE_CHECKING:
    import torch

#: What ``device`` means when no torch device is asked for: the numpy reference.
NUMPY = "numpy"


class DeviceError(ValueError):
    """A device this machine cannot run (no CUDA, a misspelt name)."""


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def torch_device(device: str, key: str = "device") -> torch.device:
    """The torch device named ``device``, checked now: a clear error naming ``key`` where
    the name is not a device or the machine lacks it (never a failure at the first step)."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise DeviceError(f"{key} = {device!r}: not a device name (expected {NUMPY!r}, "
                          "'cpu', 'cuda' or 'cuda:N')") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"{key} = {device!r}: CUDA is not available on this machine "
                              f"(torch {torch.__version__}); use 'cpu' or {NUMPY!r}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"{key} = {device!r}: this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        raise DeviceError(f"{key} = {device!r}: only {NUMPY!r}, 'cpu' and 'cuda' are supported")
    return dev


def check_device(device: str, key: str = "device") -> str:
    """``device`` if this machine can run it (``"numpy"`` always can), else DeviceError."""
    if str(device) != NUMPY:
        torch_device(str(device), key)
    return str(device)


def to_device(x: np.ndarray, device: str) -> Any:
    """``x`` on ``device``: the array itself for numpy, a torch tensor otherwise."""
    if device == NUMPY:
        return x
    import torch

    return torch.as_tensor(np.asarray(x), device=torch_device(device))


def to_numpy(x: Any) -> np.ndarray:
    """A numpy array of ``x`` (a tensor leaves its device)."""
    if is_torch(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def like(x: Any, ref: Any) -> Any:
    """``x`` (numpy) as an array of ``ref``'s kind, dtype and device."""
    if is_torch(ref):
        import torch

        return torch.as_tensor(np.asarray(x), dtype=ref.dtype, device=ref.device)
    return np.asarray(x, dtype=ref.dtype)


def rowdot(a: Any, b: Any) -> Any:
    """``sum_d a[t, d] b[t, d]`` per row t."""
    if is_torch(a):
        return (a * b).sum(dim=1)
    return np.einsum("td,td->t", a, b)


def tanh(x: Any) -> Any:
    return x.tanh() if is_torch(x) else np.tanh(x)


def sqrt(x: Any) -> Any:
    return x.sqrt() if is_torch(x) else np.sqrt(x)


def softplus_sum(x: Any) -> float:
    """``sum_t log(1 + exp(x_t))``, computed stably."""
    if is_torch(x):
        import torch

        return float(torch.logaddexp(torch.zeros_like(x), x).sum())
    return float(np.logaddexp(0.0, x).sum())


def zeros_like(x: Any) -> Any:
    if is_torch(x):
        import torch

        return torch.zeros_like(x)
    return np.zeros_like(x)


def concat(parts: list[Any]) -> Any:
    if parts and is_torch(parts[0]):
        import torch

        return torch.cat(parts)
    return np.concatenate(parts)


def scatter_rows(index: Any, values: Any, n: int) -> Any:
    """``out[index[t]] += values[t]`` for every t (in t order), ``out`` with ``n`` rows."""
    if is_torch(values):
        import torch

        idx = torch.as_tensor(np.asarray(to_numpy(index), np.int64), device=values.device)
        out = torch.zeros((n,) + tuple(values.shape[1:]), dtype=values.dtype,
                          device=values.device)
        return out.index_add_(0, idx, values)
    S = sp.csr_matrix((np.ones(len(index), dtype=values.dtype),
                       (np.asarray(index, np.int64), np.arange(len(index)))),
                      shape=(n, len(index)))
    return np.asarray(S @ values)


def sparse_on(A: sp.spmatrix, ref: Any) -> Any:
    """``A`` as ``ref``'s kind: itself for numpy, a torch sparse CSR tensor on ``ref``'s
    device and dtype for torch."""
    if not is_torch(ref):
        return A
    import warnings

    import torch

    A = sp.csr_matrix(A)
    A.sort_indices()
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            torch.as_tensor(A.indptr.astype(np.int64)), torch.as_tensor(A.indices.astype(np.int64)),
            torch.as_tensor(A.data), size=A.shape, dtype=ref.dtype, device=ref.device)


def spmm(A: Any, X: Any) -> Any:
    """``A @ X`` for a sparse A (scipy, the project's RowParallelCSR, or torch) and dense X;
    a scipy A meets a tensor X on X's device."""
    if is_torch(X) and not is_torch(A):
        A = sparse_on(A, X)
    return A @ X
