"""LP-GCN's convolution cover and the paper's per-client communication metric (Eq. 30/31)."""

import numpy as np
import pytest
import scipy.sparse as sp

from fedrec.recsys.cover import assign_items, greedy_cover, neighbour_counts


def _reference_cover(sets: list[set[int]], m: int) -> list[int]:
    """The greedy cover written out: sole holders first, then the largest gain, lowest row."""
    count = np.zeros(m, dtype=int)
    for s in sets:
        count[list(s)] += 1
    cover = [k for k, s in enumerate(sets) if any(count[i] == 1 for i in s)]
    covered = set().union(*(sets[k] for k in cover)) if cover else set()
    needed = {i for i in range(m) if count[i] > 0}
    while covered != needed:
        gain = {k: len(s - covered) for k, s in enumerate(sets) if k not in cover}
        best = max(gain, key=lambda k: (gain[k], -k))
        cover.append(best)
        covered |= sets[best]
    return cover


@pytest.mark.parametrize("seed", range(6))
def test_greedy_cover_and_assignment_match_the_written_out_algorithm(seed: int) -> None:
    holds = sp.random(25, 40, density=0.12, random_state=seed, format="csr") > 0
    sets = [set(holds.indices[holds.indptr[k]:holds.indptr[k + 1]].tolist()) for k in range(25)]
    cover = greedy_cover(holds)
    assert cover.tolist() == _reference_cover(sets, 40)
    conv = assign_items(holds, cover, np.random.default_rng([seed, 1]))
    ref_rng = np.random.default_rng([seed, 1])
    for i in range(40):
        options = [k for k in sorted(cover) if i in sets[k]]
        assert conv[i] == (options[int(ref_rng.integers(len(options)))] if options else -1)
        if options:
            assert i in sets[conv[i]]


def test_neighbour_counts_by_hand() -> None:
    # users 0..3; items 0..2; user 0 convolves items 0 and 1, user 3 item 2
    R = sp.csr_matrix(np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 1]]))
    distinct, with_repeats = neighbour_counts(R, np.array([0, 0, 3]))
    # item 0: users 1, 2 (besides 0); item 1: user 2 -> N_0 = {1, 2}, repeats 3; N_3 = {2}
    assert distinct.tolist() == [2, 0, 0, 1]
    assert with_repeats.tolist() == [3, 0, 0, 1]
