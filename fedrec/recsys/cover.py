"""LP-GCN's convolution assignment (paper 001, section 4.2) and its communication metric.

Every item needs one *convolution party* that holds it: that party gathers the item's
neighbour rows, so the set of convolution parties must cover the items. The paper takes a
greedy set cover; a party that is the only holder of some item is in every cover, so it goes
in first. Each item then goes to one of its holders in the cover, drawn at random.

The same functions serve the protocol (parties are nodes, ``strategies/lpgcn.py``) and the
paper's per-client analysis (parties are single users, ``benchmarks/lpgcn_comm.py``), so the
metric is computed for the cover the protocol would build.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def greedy_cover(holds: sp.spmatrix) -> np.ndarray:
    """Rows of ``holds`` (parties x items, non-zero = holds) whose items cover every held item.

    First every party that is an item's only holder; then, while an item is uncovered, the
    party covering most uncovered items (ties: the lowest row). Returns the rows in the order
    they joined. O(nnz + cover size x parties).
    """
    H = sp.csr_matrix(holds, dtype=bool)
    H.eliminate_zeros()
    Hc = H.tocsc()
    holders_per_item = np.diff(Hc.indptr)
    sole_items = np.flatnonzero(holders_per_item == 1)
    forced = np.unique(Hc.indices[Hc.indptr[sole_items]])
    covered = holders_per_item == 0  # an item nobody holds needs no cover
    gain = np.diff(H.indptr).astype(np.int64)
    cover: list[int] = []

    def take(row: int) -> None:
        items = H.indices[H.indptr[row]:H.indptr[row + 1]]
        new = items[~covered[items]]
        covered[new] = True
        cover.append(row)
        if len(new):  # every holder of a newly covered item gains one less
            holders = np.concatenate([Hc.indices[Hc.indptr[i]:Hc.indptr[i + 1]] for i in new])
            np.subtract.at(gain, holders, 1)
        gain[row] = -1  # never again

    for row in forced:
        take(int(row))
    while not covered.all():
        take(int(np.argmax(gain)))
    return np.asarray(cover, dtype=np.int64)


def assign_items(holds: sp.spmatrix, cover: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each item, one of its holders in ``cover`` drawn uniformly (-1 where none).

    Items are visited in order and each draw is ``rng.integers(number of options)``, options
    in ascending row order, so a given generator state gives one assignment.
    """
    H = sp.csc_matrix(holds, dtype=bool)
    H.eliminate_zeros()
    H.sort_indices()
    in_cover = np.zeros(H.shape[0], dtype=bool)
    in_cover[np.asarray(cover, dtype=np.int64)] = True
    out = np.full(H.shape[1], -1, dtype=np.int64)
    for i in range(H.shape[1]):
        rows = H.indices[H.indptr[i]:H.indptr[i + 1]]
        options = rows[in_cover[rows]]
        if len(options):
            out[i] = options[int(rng.integers(len(options)))]
    return out


def neighbour_counts(R: sp.spmatrix, conv_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per user of R (users x items, one user per party): ``|N_u|``, the distinct other users
    whose rows it receives as the convolution party of its items ``{i : conv_of[i] = u}``,
    and ``sum_i |U_i \\ u|`` over those items (the received rows counted with repetition,
    Eq. 31's numerator before the subtraction). Zero for users convolving no item."""
    R = sp.csr_matrix(R, dtype=bool)
    n, m = R.shape
    conv_of = np.asarray(conv_of, dtype=np.int64)
    items = np.flatnonzero(conv_of >= 0)
    A = sp.csr_matrix((np.ones(len(items), dtype=np.int64), (conv_of[items], items)),
                      shape=(n, m))  # party -> the items it convolves
    RT = sp.csc_matrix(R.T, dtype=np.int64)  # items x users
    reach = A @ RT  # party x users: how many of its items each user holds
    reach.setdiag(0)  # a party does not send to itself
    reach.eliminate_zeros()
    return np.diff(reach.indptr), np.asarray(reach.sum(axis=1)).ravel()
