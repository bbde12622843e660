"""The cache-blocked X @ P kernel equals the plain product (it only reorders the summation)."""

import numpy as np
import pytest
import scipy.sparse as sp

from fedrec.recsys.graph_filters import SparseItemItem
from fedrec.recsys.spmm import BlockedSymmetricSpMM, RowParallelCSR


def _symmetric(n: int, density: float, seed: int = 0) -> sp.csr_matrix:
    A = sp.random(n, n, density=density, random_state=seed, format="csr")
    return sp.csr_matrix(A + A.T)


@pytest.mark.parametrize("row_chunk,block_bytes", [(256, 10 << 20), (7, 4096), (1000, 1)])
def test_blocked_product_equals_scipy(row_chunk: int, block_bytes: int) -> None:
    P = _symmetric(3000, 0.01)
    X = np.random.default_rng(1).standard_normal((300, 3000))
    kernel = BlockedSymmetricSpMM(P, np.float64, row_chunk=row_chunk, target_block_bytes=block_bytes)
    np.testing.assert_allclose(kernel.apply(X), X @ P.toarray(), rtol=0, atol=1e-11)


def test_several_blocks_and_float32() -> None:
    P = _symmetric(2500, 0.02, seed=3)
    kernel = BlockedSymmetricSpMM(P, np.float32, row_chunk=64, target_block_bytes=64 * 4 * 1024)
    assert len(kernel.blocks) >= 2  # 2500 items in blocks of 1024 items
    X = np.random.default_rng(2).standard_normal((100, 2500))
    ref = X @ P.toarray()
    np.testing.assert_allclose(kernel.apply(X), ref, rtol=0, atol=1e-4 * np.abs(ref).max())


def test_sparse_item_item_uses_blocked_kernel_when_asked() -> None:
    P = _symmetric(1500, 0.02, seed=5)
    X = np.random.default_rng(4).standard_normal((40, 1500))
    plain, blocked = SparseItemItem(P, blocked=False), SparseItemItem(P, blocked=True)
    np.testing.assert_allclose(blocked.apply(X), plain.apply(X), rtol=0, atol=1e-11)
    assert blocked._kernel is not None and plain._kernel is None
    # sparse batches keep the sparse x sparse path
    np.testing.assert_allclose(blocked.apply(sp.csr_matrix(X[:3])), X[:3] @ P.toarray(), atol=1e-11)


def test_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="square"):
        BlockedSymmetricSpMM(sp.random(3, 4, density=0.5, format="csr"))
    with pytest.raises(ValueError, match=r"batch x 5"):
        BlockedSymmetricSpMM(_symmetric(5, 0.5)).apply(np.ones((2, 4)))
    with pytest.raises(ValueError, match="float32 or float64"):
        BlockedSymmetricSpMM(_symmetric(5, 0.5), np.int32)


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_parallel_csr_is_bit_identical_to_scipy(threads: int, dtype: type) -> None:
    """Each output row is the same dot product in the same order, whatever the row blocks."""
    rng = np.random.default_rng(3)
    A = sp.random(301, 157, density=0.05, random_state=4, format="csr", dtype=dtype)
    A = sp.csr_matrix(sp.diags((np.arange(301) != 7).astype(dtype)) @ A)  # an empty row
    X = rng.normal(size=(157, 9)).astype(dtype)
    got = RowParallelCSR(A, threads) @ X
    assert got.dtype == np.dtype(dtype) and got.shape == (301, 9)
    np.testing.assert_array_equal(got, A @ X)
    np.testing.assert_array_equal(RowParallelCSR(A.T, threads) @ got, A.T @ (A @ X))
