"""LP-GCN's Table 4 runner (benchmarks/lpgcn_table4.py): an interrupted and resumed training run
equals an uninterrupted one, a finished job stops on the stated rule, and a stale checkpoint
is never silently reused."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from benchmarks.lpgcn_table4 import Job, markdown, stopped, train_job


def _split(seed: int = 0) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    rng = np.random.default_rng(seed)
    dense = rng.random((40, 30)) < 0.2
    dense[np.arange(40), rng.integers(0, 30, 40)] = True  # every user has a positive
    test = dense & (rng.random(dense.shape) < 0.2)
    train = dense & ~test
    train[np.arange(40), np.argmax(dense, axis=1)] = True
    return sp.csr_matrix(train.astype(float)), sp.csr_matrix((test & ~train).astype(float))


def _curve(record: dict) -> list[dict]:
    return [{k: v for k, v in p.items() if k != "eval_seconds"} for p in record["curve"]]


@pytest.mark.parametrize("backbone", ["lightgcn", "lightgcn+"])
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, backbone):
    train, test = _split()
    job = Job("ml-100k", backbone, layers=2)
    whole = train_job(job, train, test, tmp_path / "a", resume=False, max_epochs=6,
                      eval_every=2, patience=100)
    first = train_job(job, train, test, tmp_path / "b", resume=False, max_epochs=4,
                      eval_every=2, patience=100)
    assert first["epochs"] == 4 and first["status"] == "cap"
    resumed = train_job(job, train, test, tmp_path / "b", resume=True, max_epochs=6,
                        eval_every=2, patience=100)
    assert resumed["epochs"] == whole["epochs"] == 6
    assert _curve(resumed) == _curve(whole)
    a = np.load(next((tmp_path / "a").iterdir()))
    b = np.load(next((tmp_path / "b").iterdir()))
    for name in ("V", "V.m", "V.v", "losses", "step_count"):
        np.testing.assert_array_equal(a[name], b[name])


def test_an_existing_checkpoint_is_not_overwritten_without_resume(tmp_path):
    train, test = _split()
    job = Job("ml-100k", "lightgcn", layers=1)
    train_job(job, train, test, tmp_path, resume=False, max_epochs=1, eval_every=1)
    with pytest.raises(SystemExit, match="--resume"):
        train_job(job, train, test, tmp_path, resume=False, max_epochs=2, eval_every=1)


def test_training_stops_after_patience_evaluations_without_a_better_ndcg():
    curve = [{"epoch": 5 * (i + 1), "ndcg@20": v} for i, v in enumerate(
        [0.1, 0.2, 0.19, 0.2, 0.18, 0.15])]
    record = {"curve": curve, "epochs": 30}
    assert stopped(record, patience=5, max_epochs=1000) is None  # ties do not count as better
    record["curve"].append({"epoch": 35, "ndcg@20": 0.17})
    record["epochs"] = 35
    assert stopped(record, patience=5, max_epochs=1000) == "patience"
    assert stopped({"curve": [], "epochs": 40}, patience=5, max_epochs=40) == "cap"


def test_the_report_marks_a_row_in_progress_and_shows_popularity():
    record = {"dataset": "gowalla", "backbone": "lightgcn+", "layers": 4, "seed": 0,
              "status": "running", "epochs": 10, "max_epochs": 1000, "train_seconds": 2000.0,
              "curve": [{"epoch": 5, "ndcg@20": 0.10, "recall@20": 0.12},
                        {"epoch": 10, "ndcg@20": 0.12, "recall@20": 0.14}]}
    text = markdown({"jobs": {"g": record},
                     "popularity": {"gowalla": {"ndcg@20": 0.0317, "recall@20": 0.0416}}})
    assert "in progress (10 of at most 1000)" in text
    assert "item popularity | - | 0.0416 | 0.0317" in text
    assert "| 0.1400 | 0.1200 | 0.1937 / 0.1487 | -0.0287 |" in text


def test_a_checkpoint_of_another_setting_is_refused_not_continued(tmp_path):
    from dataclasses import dataclass

    train, test = _split()

    @dataclass(frozen=True)
    class Other:
        dataset: str = "x"
        lr: float = 0.01

        @property
        def key(self) -> str:
            return "other"

        def setting(self) -> dict:
            return {"lr": self.lr}

    from fedrec.recsys.lightgcn import LightGCN

    build = lambda tr: LightGCN(tr, dim=4, layers=1, batch_size=64)  # noqa: E731
    train_job(Other(), train, test, tmp_path, resume=True, max_epochs=1, eval_every=1,
              build=build)
    with pytest.raises(SystemExit, match="trained with {'lr': 0.01}"):
        train_job(Other(lr=0.02), train, test, tmp_path, resume=True, max_epochs=2,
                  eval_every=1, build=build)


def test_the_cost_section_times_each_device_and_says_which_it_lacks(monkeypatch):
    """time_epoch scales timed steps to the epoch; a row's cost is epochs x s/epoch (its
    stopping point where it stopped, else the cap), and a device this machine lacks is said
    to be missing, never given a number."""
    torch = pytest.importorskip("torch")
    from benchmarks.lpgcn_table4 import MAX_EPOCHS, available, cost_lines, time_epoch
    from fedrec.recsys.lightgcn import LightGCN

    train, _ = _split()
    for device in ("numpy", "cpu"):
        t = time_epoch(LightGCN(train, dim=4, layers=1, batch_size=16, device=device), 2)
        assert t["steps_timed"] == 2 and t["steps_per_epoch"] > 2
        assert t["s_per_epoch"] == pytest.approx(t["triples_seconds"]
                                                 + t["s_per_step"] * t["steps_per_epoch"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA is not available" in available("cuda") and available("cpu") is None
    one = {"s_per_epoch": 36.0, "steps_per_epoch": 9}
    slow = {"s_per_epoch": 360.0, "steps_per_epoch": 9}
    result = {"jobs": {"gowalla/lightgcn+/L4/seed0": {"status": "patience", "epochs": 300},
                       "gowalla/lightgcn/L4/seed0": {"status": "running", "epochs": 5}},
              "popularity": {},
              "cost": {"steps_timed": 2, "unavailable": {"cuda": "no"},
                       "rows": {"gowalla/lightgcn+/L4/seed0": {"numpy": one, "cpu-1": one,
                                                                "cpu-2": slow},
                                "gowalla/lightgcn/L4/seed0": {"numpy": one, "cpu-1": slow,
                                                              "cpu-2": one}}}}
    text = "\n".join(cost_lines(result))
    assert "| 300 (stopped) | 3 | 3 |" in text  # 300 x 36 s = 3 h, torch's faster threads
    assert f"| {MAX_EPOCHS} (cap; 5 run) | 10 | 10 |" in text
    assert text.count("not measured: no accelerator on this machine") == 2


def test_a_device_this_machine_lacks_stops_the_runner_at_once(monkeypatch):
    torch = pytest.importorskip("torch")
    import sys

    from benchmarks import lpgcn_table4

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["lpgcn_table4.py", "--jobs", "fig11", "--device", "cuda"])
    with pytest.raises(SystemExit, match=r"--device: .*'cuda': CUDA is not available"):
        lpgcn_table4.main()
