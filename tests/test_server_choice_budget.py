"""A budget refusal depends on published numbers only, never on a node's interaction count.

A node's memory estimates used to count its training interactions, so a server varying a
size (FedMF's negatives, a FedSVD rank, PriviRec's catalogue) against the node's budget
could bisect the count (for a one-user node: the user's degree). The estimates now use the
smallest power of two at least that count, which the handshake publishes
(``info.interactions-bound``): twins whose counts differ inside one power of two are
refused or served alike at every size, and the control (the count itself) is not.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from flwr.app import Context, RecordDict

from clients.node import NodeContext
from clients.policy import NodePolicy, PolicyError
from datasets import NodeData

N_ITEMS = 64


def _node(nnz: int, budget_mb: float) -> NodeContext:
    """A node of one user holding ``nnz`` items (training rows), under ``budget_mb``."""
    train = sp.csr_matrix((np.ones(nnz), (np.zeros(nnz, int), np.arange(nnz))),
                          shape=(1, N_ITEMS))
    data = NodeData(partition_id=0, user_ids=np.array([0]), train=train,
                    test=sp.csr_matrix((1, N_ITEMS)), user_features=None, n_items=N_ITEMS,
                    n_users_total=1)
    context = Context(run_id=1, node_id=1001, state=RecordDict(), run_config={},
                      node_config={"partition-id": 0, "num-partitions": 1})
    node = NodeContext(context, RecordDict(), NodePolicy(memory_budget_mb=budget_mb))
    node.data = lambda: data  # type: ignore[method-assign]
    return node


def _fedmf_refused(nnz: int, negatives: int, budget_mb: float) -> bool:
    from clients.fedmf import _reserve_training

    try:
        _reserve_training(_node(nnz, budget_mb), 2, negatives, 10**6, 1, "exact")
    except PolicyError:
        return True
    return False


def _fedmf_bytes(triples: float) -> float:
    """FedMF exact mode's estimate for ``triples`` BPR triples (clients/fedmf.py)."""
    return 8.0 * (8 * triples + 6 * triples * 2 + 6 * (1 + N_ITEMS) * 2)


@pytest.mark.parametrize("negatives", [500, 5000, 50000])
def test_twins_inside_one_power_of_two_are_refused_alike(negatives: int) -> None:
    """Counts 33 and 64 share the bound 64: for a budget between their own estimates,
    both are refused (or both served), whatever the server's negatives."""
    budget = (_fedmf_bytes(33 * negatives) + _fedmf_bytes(64 * negatives)) / 2 / 2**20
    assert _fedmf_refused(33, negatives, budget) == _fedmf_refused(64, negatives, budget)
    roomy = 2 * _fedmf_bytes(64 * negatives) / 2**20
    assert not _fedmf_refused(33, negatives, roomy) and not _fedmf_refused(64, negatives, roomy)


def test_the_hello_publishes_the_bound_the_estimates_use() -> None:
    from fl_app.client_app import build_client_app
    from tests.malicious import MaliciousGrid

    data = {"dataset": "synthetic", "synthetic-users": 30, "synthetic-items": 20}
    with MaliciousGrid(build_client_app(policy={}), 3, data=data) as grid:
        info = grid.ask(grid.ids[0], "hello", RecordDict()).config_records["info"]
        node = NodeContext(grid.contexts[grid.ids[0]], RecordDict())
        nnz = int(node.data().train.nnz)
    bound = info["interactions-bound"]
    assert bound == node.interactions_bound() and bound >= nnz and bound < 2 * max(nnz, 1)
    assert bound & (bound - 1) == 0  # a power of two


def test_the_control_an_estimate_from_the_count_separates_the_twins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the estimate counting the interactions themselves (as before), the same budget
    refuses one twin and serves the other: the measurement sees the leak it guards."""
    monkeypatch.setattr(NodeContext, "interactions_bound",
                        lambda self: int(self.data().train.nnz))
    negatives = 500
    budget = (_fedmf_bytes(33 * negatives) + _fedmf_bytes(64 * negatives)) / 2 / 2**20
    assert _fedmf_refused(33, negatives, budget) != _fedmf_refused(64, negatives, budget)


def test_privirecs_masked_product_reserves_by_the_bound_not_the_count() -> None:
    """PriviRec's masked item-item product reserves the same for counts 33 and 64."""
    from clients.privirec import _reserve_product

    reserved = []
    for nnz in (33, 64):
        node = _node(nnz, 1e6)
        train = node.data().train
        _reserve_product(node, train, np.asarray(train.sum(axis=1)).ravel(), sparse=False)
        reserved.append(node.reserved)
    assert reserved[0] == reserved[1]
