"""The node's DP ledger (``clients/dp_ledger.py``): a budget that holds across runs, per
identity and data, written before a release, safe under concurrent processes, and never
silently reset."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from clients.dp_ledger import Ledger, LedgerError, LedgerKey, data_digest
from clients.policy import NodePolicy, PolicyError
from fedrec.dp import PrivacyLedger
from fedrec.transport.messenger import NodeError
from tests.test_dp_prototypes import TINY, _run

KEY_A, KEY_B = LedgerKey("aa", "d1"), LedgerKey("bb", "d1")


def _entries(path: Path) -> dict:
    return json.loads(path.read_text())["entries"]


def _release(epsilon: float, name: str = "a release") -> PrivacyLedger:
    """The accountant of one pure release of ``epsilon``."""
    ledger = PrivacyLedger()
    ledger.record(name, "laplace", epsilon, sensitivity=1.0)
    return ledger


def test_a_new_run_cannot_release_again_past_the_budget(tmp_path: Path) -> None:
    """Each run is a new Flower run (fresh node state); the ledger file carries the
    spending, so the second release of epsilon 1 under dp-budget 1.5 is refused."""
    ledger = tmp_path / "silos.json"
    policy = {"allow-plain": True, "dp-budget": 1.5, "dp-ledger": str(ledger)}
    _run({}, policy=policy)
    with pytest.raises(NodeError, match=r"epsilon 1 on top of 1 spent exceeds its node "
                                        r"policy dp-budget=1.5"):
        _run({}, policy=policy)
    entries = _entries(ledger)
    assert len(entries) == 3  # one per silo identity: each spent its own 1, not 3
    assert all(e["epsilon"] == pytest.approx(1.0) for e in entries.values())
    assert all(len(e["releases"]) == 1 and e["releases"][0]["what"].startswith(
        "a dp-prototypes release") for e in entries.values())
    _run({}, policy={**policy, "dp-ledger": str(tmp_path / "other.json")})  # independent


def test_the_charge_is_written_before_the_release(tmp_path: Path, monkeypatch) -> None:
    import clients.dp_prototypes as node_side

    def broken(*args, **kwargs):
        raise RuntimeError("release failed")

    monkeypatch.setattr(node_side, "private_prototypes", broken)
    ledger = tmp_path / "l.json"
    with pytest.raises(NodeError, match="release failed"):
        _run({}, policy={"allow-plain": True, "dp-budget": 5.0, "dp-ledger": str(ledger)})
    assert sum(e["epsilon"] for e in _entries(ledger).values()) >= 1.0


def test_identities_and_paths_keep_separate_budgets(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    assert Ledger(path).charge(KEY_A, _release(1.0), 1.0, "x", 1) == pytest.approx(1.0)
    assert Ledger(path).charge(KEY_B, _release(1.0), 1.0, "x", 1) == pytest.approx(1.0)
    assert Ledger(tmp_path / "m.json").charge(KEY_A, _release(1.0), 1.0, "x", 1) == \
        pytest.approx(1.0)
    policy = NodePolicy(dp_budget=1.0, dp_ledger=str(path))
    with pytest.raises(PolicyError, match="on top of 1 spent exceeds"):
        policy.charge_dp({}, _release(0.5), "a release", "node 1", key=KEY_A)
    assert Ledger(path).spent(KEY_A) == pytest.approx(1.0)  # a refusal writes nothing


def test_the_data_key_ignores_what_the_server_chooses_about_the_split() -> None:
    """Split and partition parameters come from the server: changing them must not give
    the same people a fresh budget. The data source itself does change the key."""
    base = {k: v for k, v in TINY.items() if k != "protocol"}
    same = data_digest(base)
    for change in ({"test-ratio": 0.5}, {"partition": "iid"}, {"num-partitions": 7},
                   {"min-rating": 3.0}, {"cold-start-users": 0.2}):
        assert data_digest({**base, **change}) == same, change
    assert data_digest({**base, "synthetic-users": 121}) != same
    real = {"dataset": "ml-100k", "data-dir": "/srv/data"}
    assert data_digest({**real, "seed": 9, "test-ratio": 0.1}) == data_digest(real)
    assert data_digest({**real, "data-dir": "/srv/data/."}) == data_digest(real)
    assert data_digest({**real, "data-dir": "/srv/other"}) != data_digest(real)


def _charge_many(path: str, count: int) -> None:
    for _ in range(count):
        Ledger(path).charge(KEY_A, _release(0.01), 100.0, "concurrent", 1)


def test_concurrent_charges_from_two_processes_are_all_kept(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.json")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_charge_many, args=(path, 25)) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert Ledger(path).spent(KEY_A) == pytest.approx(0.5, rel=1e-9)
    assert len(Ledger(path).releases(KEY_A)) == 50


@pytest.mark.parametrize("text", ["{not json", '{"format": 1, "entries": []}',
                                  '{"format": 1, "entries": {"k": {"epsilon": -1, '
                                  '"releases": []}}}', ""])
def test_an_unreadable_ledger_is_an_error_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "broken.json"
    path.write_text(text)
    policy = NodePolicy(dp_budget=10.0, dp_ledger=str(path))
    with pytest.raises(LedgerError, match=f"DP ledger {path}") as err:
        policy.charge_dp({}, _release(0.5), "a release", "node 1", key=KEY_A)
    assert "not reset" in str(err.value)
    assert path.read_text() == text  # never silently replaced


def test_the_ledger_path_comes_from_the_policy_then_the_environment(tmp_path: Path,
                                                                     monkeypatch) -> None:
    from clients.dp_ledger import LEDGER_ENV, ledger_path

    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "env.json"))
    assert ledger_path(NodePolicy().dp_ledger) == tmp_path / "env.json"
    assert ledger_path(NodePolicy(dp_ledger=str(tmp_path / "p.json")).dp_ledger) == tmp_path / "p.json"
    monkeypatch.delenv(LEDGER_ENV)
    assert str(ledger_path(NodePolicy().dp_ledger)).endswith(".local/state/fedrec-privacy/dp-ledger.json")


def test_the_ledger_keeps_every_release_as_rows_of_the_one_accountant(tmp_path: Path) -> None:
    """What a key has spent is PrivacyLedger.spent() over the rows of all its releases
    (a Gaussian release by its per-release epsilon times its steps), and the rows are the
    release's own."""
    path = tmp_path / "l.json"
    gaussian = PrivacyLedger()
    gaussian.record("noisy iterations", "gaussian", 0.2, 1e-5, sigma=3.0, sensitivity=1.0,
                    steps=4)
    assert Ledger(path).charge(KEY_A, gaussian, 2.0, "svd", 1) == pytest.approx(0.8)
    assert Ledger(path).charge(KEY_A, _release(0.5), 2.0, "prototypes", 2) == \
        pytest.approx(1.3)
    history = Ledger(path).history(KEY_A)
    assert history.to_table_rows() == gaussian.to_table_rows() + _release(0.5).to_table_rows()
    assert history.spent() == pytest.approx(Ledger(path).spent(KEY_A))
    with pytest.raises(PolicyError, match="on top of 1.3 spent exceeds"):
        NodePolicy(dp_budget=2.0, dp_ledger=str(path)).charge_dp(
            {}, gaussian, "a release", "node 1", key=KEY_A)


def test_a_format_1_ledger_keeps_counting_and_edits_only_over_charge(tmp_path: Path) -> None:
    """A file written before releases kept their rows still counts (each old release is
    one row of its epsilon); lowering the recorded total by hand lowers nothing."""
    path = tmp_path / "old.json"
    old = {"identity": "aa", "data": "d1", "epsilon": 0.75,
           "releases": [{"run": 1, "what": "old release", "epsilon": 0.75, "time": 0.0}]}
    path.write_text(json.dumps({"format": 1, "entries": {KEY_A.text: old}}))
    policy = NodePolicy(dp_budget=1.0, dp_ledger=str(path))
    with pytest.raises(PolicyError, match="on top of 0.75 spent exceeds"):
        policy.charge_dp({}, _release(0.5), "a release", "node 1", key=KEY_A)
    assert Ledger(path).charge(KEY_A, _release(0.25), 1.0, "x", 2) == pytest.approx(1.0)
    assert json.loads(path.read_text())["format"] == 2
    assert [e.mechanism for e in Ledger(path).history(KEY_A).entries] == ["recorded", "laplace"]
    data = json.loads(path.read_text())
    data["entries"][KEY_A.text]["epsilon"] = 0.0  # a hand edit
    path.write_text(json.dumps(data))
    assert Ledger(path).spent(KEY_A) == pytest.approx(1.0)


def test_a_silo_charges_exactly_the_ledger_its_results_report(tmp_path: Path) -> None:
    """The node's budget check and the run's reported DP ledger read the same rows."""
    path = tmp_path / "l.json"
    _, outcome = _run({}, policy={"allow-plain": True, "dp-budget": 5.0,
                                  "dp-ledger": str(path)})
    charged = sorted(json.dumps(release["entries"], sort_keys=True)
                     for entry in _entries(path).values() for release in entry["releases"])
    reported = sorted(json.dumps(s["entries"], sort_keys=True)
                      for s in outcome.privacy["dp"]["ledgers"].values())
    assert charged == reported and len(charged) >= 2
