"""The node's DP ledger (``clients/dp_ledger.py``): a budget that holds across runs, per row
released (by the rows' content, whatever the server's config calls them), written before a
release, safe under concurrent processes, and never silently reset."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from clients.dp_ledger import BudgetExceeded, Ledger, LedgerError, LedgerKey
from clients.policy import NodePolicy, PolicyError
from datasets import DatasetSpec, load_dataset, row_digests
from fedrec.dp import PrivacyLedger
from fedrec.transport.messenger import NodeError
from tests.test_dp_prototypes import TINY, _run

ROW_1, ROW_2, ROW_3 = (bytes([i]) * 16 for i in (1, 2, 3))
KEY_A, KEY_B = LedgerKey("aa", (ROW_1, ROW_2)), LedgerKey("bb", (ROW_3,))


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


def test_distinct_rows_and_files_keep_separate_budgets(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    assert Ledger(path).charge(KEY_A, _release(1.0), 1.0, "x", 1) == pytest.approx(1.0)
    assert Ledger(path).charge(KEY_B, _release(1.0), 1.0, "x", 1) == pytest.approx(1.0)
    assert Ledger(tmp_path / "m.json").charge(KEY_A, _release(1.0), 1.0, "x", 1) == \
        pytest.approx(1.0)
    policy = NodePolicy(dp_budget=1.0, dp_ledger=str(path))
    with pytest.raises(PolicyError, match="on top of 1 spent exceeds"):
        policy.charge_dp({}, _release(0.5), "a release", "node 1", key=KEY_A)
    assert Ledger(path).spent(KEY_A) == pytest.approx(1.0)  # a refusal writes nothing


@pytest.mark.parametrize("rows", [(ROW_1, ROW_2), (ROW_2,), (ROW_2, ROW_3)],
                         ids=["same rows", "a subset", "an overlapping superset"])
def test_a_row_draws_on_one_budget_whoever_releases_it(tmp_path: Path, rows) -> None:
    """The budget is per row: the same rows, a subset or a set overlapping them, released
    under another identity (a simulated node's identity follows its partition label), draw
    on the budget the first release spent; rows no release held do not."""
    path = tmp_path / "l.json"
    Ledger(path).charge(KEY_A, _release(0.75), 1.0, "first", 1)
    with pytest.raises(BudgetExceeded):
        Ledger(path).charge(LedgerKey("cc", rows), _release(0.5), 1.0, "again", 2)
    assert Ledger(path).charge(LedgerKey("cc", (ROW_3,)), _release(0.5), 1.0, "other", 2) == \
        pytest.approx(0.5)
    assert Ledger(path).spent(LedgerKey("dd", rows)) == pytest.approx(0.75)


def _files(folder: Path, train: sp.csr_matrix, test: sp.csr_matrix, text: bool) -> None:
    """``train``/``test`` as one of the two accepted file sets of a given split."""
    folder.mkdir(parents=True)
    if not text:
        sp.save_npz(folder / "train.npz", train)
        sp.save_npz(folder / "test.npz", test)
        return
    for name, m in (("train.txt", train), ("test.txt", test)):
        lines = [" ".join(map(str, [u, *m[u].indices])) for u in range(m.shape[0])]
        (folder / name).write_text("\n".join(lines) + "\n")


@pytest.fixture
def copies(tmp_path: Path) -> dict[str, dict]:
    """TINY's rows as data configs a server may name: the generator itself, an ``.npz`` and
    a text copy under other dataset names and folders (the text one with train and test
    swapped), and a re-split of the copy."""
    base = {k: v for k, v in TINY.items() if k != "protocol"}
    data = load_dataset(DatasetSpec.from_config(base))
    _files(tmp_path / "one" / "silo-a", data.train, data.test, text=False)
    _files(tmp_path / "two" / "archive", data.test, data.train, text=True)
    return {"generator": base,
            "npz": {"dataset": "silo-a", "data-dir": str(tmp_path / "one")},
            "text": {"dataset": "archive", "data-dir": str(tmp_path / "two"),
                     "min-rating": 0.5},
            "re-split": {"dataset": "silo-a", "data-dir": str(tmp_path / "one"),
                         "seed": 9, "cold-start-users": 0.2}}


def test_row_digests_follow_the_rows_not_their_names(copies: dict[str, dict]) -> None:
    """Same rows: same digests from the generator, .npz or text, under any dataset name,
    folder, seed or split option; other rows (another generator seed): other digests."""
    users = np.arange(120)
    same = row_digests(DatasetSpec.from_config(copies["generator"]), users)
    assert len(set(same)) == 120
    for name, cfg in copies.items():
        assert row_digests(DatasetSpec.from_config(cfg), users) == same, name
    other = row_digests(DatasetSpec.from_config({**copies["generator"], "seed": 2}), users)
    assert not set(other) & set(same)


def test_the_same_rows_under_other_names_draw_on_one_budget(
        tmp_path: Path, copies: dict[str, dict]) -> None:
    """The attack: dp-prototypes runs over the same rows under four dataset names, folders,
    file formats and split options, epsilon 1 each against dp-budget = 1. The first
    releases; the silos refuse every other, their rows having spent their budget."""
    policy = {"allow-plain": True, "dp-budget": 1.0, "dp-ledger": str(tmp_path / "l.json")}
    names = list(copies)
    _run(copies[names[0]], policy=policy)
    for name in names[1:]:
        with pytest.raises(NodeError, match="epsilon 1 on top of 1 spent exceeds"):
            _run(copies[name], policy=policy)
    _run({**copies["generator"], "seed": 2}, policy=policy)  # other rows: their own budget


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
                                  '"releases": []}}}', "",
                                  '{"format": 3, "entries": {}, "node-sets": {"k": "0,1"}}'])
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
    path.write_text(json.dumps({"format": 1, "entries": {"aa:d1": old}}))
    policy = NodePolicy(dp_budget=1.0, dp_ledger=str(path))
    with pytest.raises(PolicyError, match="on top of 0.75 spent exceeds"):
        policy.charge_dp({}, _release(0.5), "a release", "node 1", key=KEY_A)
    assert Ledger(path).charge(KEY_A, _release(0.25), 1.0, "x", 2) == pytest.approx(1.0)
    assert json.loads(path.read_text())["format"] == 3
    assert [e.mechanism for e in Ledger(path).history(KEY_A).entries] == ["recorded", "laplace"]
    data = json.loads(path.read_text())
    data["entries"]["aa:d1"]["epsilon"] = 0.0  # hand edits
    data["entries"]["aa"]["releases"][0]["epsilon"] = 0.0
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


def test_the_file_holds_each_identity_to_the_node_set_of_its_first_run(tmp_path: Path) -> None:
    """The node set a roster identity committed to (``clients/nodeset.py``) is kept in the
    same file: the same set again passes, a subset only when dropouts are allowed, another
    set never; other identities or rosters keep their own."""
    from clients.dp_ledger import NodeSetDiffers

    ledger = Ledger(tmp_path / "l.json")
    ledger.commit_node_set("aa:r1", [3, 1, 0, 2], shrink=False)
    ledger.commit_node_set("aa:r1", [0, 1, 2, 3], shrink=False)
    for other, shrink in (([1, 2, 3], False), ([0, 1, 2, 3, 4], True), ([0, 1, 5], True)):
        with pytest.raises(NodeSetDiffers):
            ledger.commit_node_set("aa:r1", other, shrink=shrink)
    ledger.commit_node_set("aa:r1", [1, 2, 3], shrink=True)
    ledger.commit_node_set("bb:r1", [1, 2, 3], shrink=False)
    assert json.loads((tmp_path / "l.json").read_text())["node-sets"] == {
        "aa:r1": [0, 1, 2, 3], "bb:r1": [1, 2, 3]}
