"""LightGCN on a torch device (fedrec/recsys/arrays.py): on CPU in float64 the torch path
equals the numpy reference to rounding (forward, one step's gradients, a whole epoch, both
backbones), an LP-GCN federation whose nodes compute on torch still equals centralized
training, and a device the machine lacks stops the model or the run at once, naming the key.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from fedrec.recsys import arrays
from fedrec.recsys.arrays import DeviceError
from fedrec.recsys.lightgcn import LightGCN, bpr_terms
from fedrec.recsys.mf import Adam

torch = pytest.importorskip("torch")
#: float64, the same operations in another summation order (torch's sparse kernel and
#: index_add_ against scipy's): measured differences <= 3e-16 after two epochs; a wrong
#: operation (a transposed operator, a missing layer) moves values by ~1e-2.
ATOL = 1e-12


def _graph(seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    dense = rng.random((50, 35)) < 0.2
    dense[np.arange(50), rng.integers(0, 35, 50)] = True
    return sp.csr_matrix(dense.astype(float))


def _pair(backbone: str, **kw) -> tuple[LightGCN, LightGCN]:
    args = dict(dim=6, layers=2, lr=0.02, reg=1e-2, batch_size=64, seed=3, backbone=backbone,
                **kw)
    R = _graph()
    return LightGCN(R, **args), LightGCN(R, device="cpu", **args)


@pytest.mark.parametrize("backbone", ["lightgcn", "lightgcn+"])
def test_forward_on_torch_cpu_equals_numpy(backbone) -> None:
    ref, dev = _pair(backbone)
    assert arrays.is_torch(dev.V) and not arrays.is_torch(ref.V)
    (ua, ia), (ub, ib) = ref.forward(), dev.forward()
    for a, b in zip(ua + ia, ub + ib):
        np.testing.assert_allclose(a, arrays.to_numpy(b), rtol=0, atol=ATOL)
    uf, vf = dev.final_embeddings()
    assert isinstance(uf, np.ndarray) and isinstance(vf, np.ndarray)


@pytest.mark.parametrize("backbone", ["lightgcn", "lightgcn+"])
def test_one_steps_gradients_on_torch_cpu_equal_numpy(backbone) -> None:
    """After the first Adam step the first moment is (1 - beta1) x the gradient, for every
    row of every table."""
    ref, dev = _pair(backbone)
    assert ref.step() == pytest.approx(dev.step(), abs=ATOL)
    beta = Adam(1.0).beta1
    for name in ref.opt:
        g_ref = ref.opt[name].m / (1 - beta)
        g_dev = arrays.to_numpy(dev.opt[name].m) / (1 - beta)
        assert np.abs(g_ref).max() > 1e-4  # a real gradient, not zeros on both sides
        np.testing.assert_allclose(g_ref, g_dev, rtol=0, atol=ATOL)


@pytest.mark.parametrize("backbone", ["lightgcn", "lightgcn+"])
def test_a_whole_epoch_on_torch_cpu_equals_numpy(backbone) -> None:
    ref, dev = _pair(backbone)
    ref.fit(ref.nbatches + 1)  # an epoch and the next epoch's first step
    dev.fit(dev.nbatches + 1)
    np.testing.assert_allclose(ref.losses, dev.losses, rtol=0, atol=ATOL)
    a, b = ref.state_arrays(), dev.state_arrays()
    assert sorted(a) == sorted(b)
    for key in a:
        assert isinstance(b[key], np.ndarray)
        np.testing.assert_allclose(a[key], b[key], rtol=0, atol=ATOL)


def test_a_torch_checkpoint_continues_on_numpy_and_back() -> None:
    """The checkpoint is numpy whatever the device, so a run moves between machines."""
    ref, dev = _pair("lightgcn")
    ref.fit(3)
    dev.fit(1)
    moved = LightGCN(_graph(), dim=6, layers=2, lr=0.02, reg=1e-2, batch_size=64, seed=3)
    moved.load_state_arrays(dev.state_arrays()).fit(2)
    np.testing.assert_allclose(moved.V, ref.V, rtol=0, atol=ATOL)


def test_bpr_terms_take_numpy_or_tensors_alike() -> None:
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(9, 4)) for _ in range(6)]
    a = bpr_terms(*xs, reg=0.1, batch_size=16)
    b = bpr_terms(*(torch.as_tensor(x) for x in xs), reg=0.1, batch_size=16)
    assert a.loss == pytest.approx(b.loss, abs=1e-14)
    for name in ("d_user", "d_pos", "d_neg", "r_user", "r_pos", "r_neg"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name).numpy(), atol=1e-15)


def test_cuda_without_cuda_is_refused_naming_the_key(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=r"device = 'cuda': CUDA is not available"):
        LightGCN(_graph(), dim=4, layers=1, device="cuda")
    with pytest.raises(DeviceError, match=r"device = 'tpu'"):
        LightGCN(_graph(), dim=4, layers=1, device="tpu")


# -- LP-GCN nodes computing on torch -------------------------------------------------------------
def test_lpgcn_nodes_on_torch_cpu_equal_centralized_training(monkeypatch) -> None:
    """Every node's operator sets ``lpgcn-device = "cpu"``: the run's losses and every node's
    layer-0 rows still equal the centralized reference (numpy), and the nodes did compute on
    torch (their conversions to the device are counted)."""
    import clients.lpgcn as node_module
    from clients.lpgcn import stored_params
    from fl_app.registry import resolve_config
    from strategies.lpgcn import LPGCN
    from tests.test_lpgcn import BASE, NODES, _run

    moved = []

    def counting(x, device):
        moved.append(device)
        return arrays.to_device(x, device)

    monkeypatch.setattr(node_module, "to_device", counting)
    extra = {"lpgcn-steps": 3, "run-name": "test-lpgcn-device"}
    record, grid = _run(extra, node_configs={i: {"lpgcn-device": "cpu"} for i in range(NODES)})
    assert moved and set(moved) == {"cpu"}
    from datasets import DatasetSpec, load_dataset

    data = load_dataset(DatasetSpec.from_config(BASE))
    ref = LPGCN(resolve_config({**BASE, **extra})).reference_model(data.train)
    ref.fit(3)
    # the tolerance of tests/test_lpgcn.py::test_federated_equals_centralized (same reasons)
    np.testing.assert_allclose(record["extra"]["losses"], ref.losses, rtol=0, atol=1e-10)
    for nid in grid.ids:
        p = stored_params(grid.contexts[nid].state)
        assert all(isinstance(v, np.ndarray) for v in p.values())
        if "U" in p:
            np.testing.assert_allclose(p["U"], ref.U[p["user_ids"]], rtol=0, atol=1e-10)
        if len(p["conv_real"]):
            np.testing.assert_allclose(p["V"], ref.V[p["conv_real"]], rtol=0, atol=1e-10)


def test_an_lpgcn_node_without_cuda_refuses_at_the_first_request(monkeypatch) -> None:
    from fedrec.transport.messenger import NodeError
    from tests.test_lpgcn import NODES, _run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NodeError, match=r"node config 'lpgcn-device' = 'cuda': CUDA is not "
                                        r"available"):
        _run({"lpgcn-steps": 1, "run-name": "test-lpgcn-cuda"},
             node_configs={i: {"lpgcn-device": "cuda"} for i in range(NODES)})


def test_threads_set_torchs_cpu_threads() -> None:
    """On a shared machine one torch thread beats two spinning ones (results/lpgcn/table4.md):
    ``threads`` reaches torch on CPU."""
    before = torch.get_num_threads()
    try:
        LightGCN(_graph(), dim=4, layers=1, device="cpu", threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
