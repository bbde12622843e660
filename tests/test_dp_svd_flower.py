"""The verdict of ``benchmarks/dp_svd_flower.py``: a federated run's NDCG@20 is called
"within" the in-process draws only inside their mean +- 3 sample standard deviations; a
value outside, or draws without a spread, claim nothing."""

from __future__ import annotations

from benchmarks import dp_svd_flower


def test_within_needs_the_band_and_a_spread() -> None:
    draws = [0.20, 0.21, 0.22]  # mean 0.21, sd 0.01
    assert dp_svd_flower.within(0.235, draws)
    assert not dp_svd_flower.within(0.245, draws)  # 3.5 sd above
    assert not dp_svd_flower.within(0.17, draws)  # 4 sd below
    assert not dp_svd_flower.within(0.21, [0.21])  # one draw: no spread, no verdict
    assert dp_svd_flower.within(0.21, [0.21, 0.21])  # equal draws: only their value
    assert not dp_svd_flower.within(0.2101, [0.21, 0.21])
