"""The leaderboard (benchmarks/leaderboard.py, its cells in benchmarks/_board.py, its report in
benchmarks/_board_report.py): rows come from the runs' own records, what the server sees and
epsilon are read from each run's privacy section, a refused cell is shown with its reason, and
every cell of the default board is declared with its node policy."""

from __future__ import annotations

import pytest

from benchmarks import _board as board
from benchmarks import _board_report as report
from benchmarks import leaderboard as lb


def _cell(protocol: str, fed: dict, privacy: dict | None = None, **kw) -> dict:
    return {"protocol": protocol, "dataset": "ml-100k", "nodes": 8, "federated": fed,
            "centralized": kw.get("centralized", {}), "popularity": {"ndcg@20": 0.2,
                                                                   "recall@20": 0.15},
            "rounds": 10, "bytes_per_node": 2e6,
            "server_sees": board.server_sees(protocol, privacy or {}),
            "epsilon": board.dp_epsilon(privacy or {})}


def test_rows_rank_every_model_of_every_cell_and_keep_its_reference() -> None:
    result = {"cells": {
        "ml-100k/privirec": _cell("privirec", {"gf-cf/ndcg@20": 0.37, "gf-cf/recall@20": 0.31,
                                               "bspm-lm/ndcg@20": 0.35},
                                  {"sums": [{"form": "masked"}]},
                                  centralized={"gf-cf/ndcg@20": 0.38}),
        "ml-100k/dp-prototypes": _cell("dp-prototypes", {"ndcg@20": 0.02},
                                       {"sums": [{"form": "masked"}],
                                        "dp": {"run_epsilon": 1.0, "epsilon": 1.0}}),
    }, "failed": {"ml-100k/lpgcn": "RunFailedError: an item without training"}}
    rows = report.rows(result, "ml-100k")
    assert [r["name"] for r in rows] == ["privirec (gf-cf)", "privirec (bspm-lm)",
                                         "dp-prototypes"]
    assert rows[0]["cen_ndcg"] == 0.38 and rows[1]["cen_ndcg"] is None
    text = report.markdown(result)
    assert "| privirec (gf-cf) | 0.3700 | 0.3800 | 0.974 | 0.3100 | 1.85x |" in text
    assert "| dp-prototypes | 0.0200 |" in text and "masked + noised | 1 |" in text
    assert "Best with a DP guarantee: dp-prototypes (0.0200 at epsilon 1)" in text
    assert "`ml-100k/lpgcn`: RunFailedError: an item without training" in text


def test_what_the_server_sees_follows_the_recorded_sums() -> None:
    assert board.server_sees("fedmf", {"sums": [{"form": "plain"}]}) == "plain"
    assert board.server_sees("privmvmf", {"sums": [{"form": "ckks"}]}) == "encrypted"
    assert board.server_sees("fedsvd-privacy", {"sums": [{"form": "masked"}]}) == "masked + noised"
    assert board.dp_epsilon({"sums": []}) is None
    # FedPower's claimed epsilon is marked not valid: it is no DP guarantee on the board
    fedpower = {"dp": {"epsilon": 10.7, "valid": False, "reason": "noise after D"}}
    assert board.dp_epsilon(fedpower) is None and board.dp_epsilon(fedpower, valid=False) == 10.7
    cell = {"epsilon": None, "epsilon_not_valid": 10.7}
    assert report._epsilon_cell(cell) == "none (claims 10.7, not a guarantee)"


def test_every_default_cell_is_declared_with_its_policy() -> None:
    cells = board.cells(["ml-100k", "ml-1m"], board.ORDER)
    assert len(cells) == 2 * len(board.ORDER) == len({c.key for c in cells})
    by = {c.key: c for c in cells}
    assert by["ml-1m/dp-prototypes"].config["dpp-k"] == 50  # Fig. 3's k on ML-1M
    assert by["ml-100k/dp-prototypes"].nodes == 11 and by["ml-1m/dp-prototypes"].nodes == 10
    assert by["ml-100k/lpgcn"].config["drop-cold-items"] is True
    assert by["ml-100k/privmvmf"].policy == {"allow-ckks": True}
    assert by["ml-100k/fedmf"].policy == {}  # the safe default: SecAgg+, nothing opted in


def _tiny_split(folder, fmt: str) -> None:
    """Four users over five items, every item trained: the smallest split a board reads."""
    folder.mkdir(parents=True)
    train = {0: [0, 1, 2], 1: [1, 3], 2: [2, 4, 0], 3: [3, 4, 1]}
    test = {0: [3], 1: [4], 2: [1], 3: [0]}
    if fmt == "txt":
        for name, rows in (("train", train), ("test", test)):
            (folder / f"{name}.txt").write_text(
                "".join(f"{u} {' '.join(map(str, items))}\n" for u, items in rows.items()))
        return
    import numpy as np
    import scipy.sparse as sp

    for name, rows in (("train", train), ("test", test)):
        m = sp.lil_matrix((4, 5))
        for u, items in rows.items():
            m[u, items] = 1.0
        sp.save_npz(folder / f"{name}.npz", sp.csr_matrix(m, dtype=np.float64))


@pytest.mark.parametrize("fmt", ["txt", "npz"])
def test_a_users_own_split_runs_on_the_board(tmp_path, monkeypatch, fmt) -> None:
    """--datasets takes any folder name and --data-dir, as run_simulation.py does; the
    cell's run config carries both, and the board is headed by the folder's name."""
    _tiny_split(tmp_path / "data" / "my-split", fmt)
    seen = []

    def fake_run(cell: board.Cell, result: dict | None = None) -> dict:
        seen.append(cell.config)
        return {**_cell(cell.protocol, {"ndcg@20": 0.3, "recall@20": 0.2}),
                "dataset": cell.dataset}

    monkeypatch.setattr(lb, "run_cell", fake_run)
    monkeypatch.setattr(lb, "plot", lambda result, path: None)
    out = tmp_path / "board.json"
    lb.main(["--datasets", "my-split", "--data-dir", str(tmp_path / "data"),
             "--protocols", "fedmf", "--nodes", "4", "--out", str(out)])
    assert seen and seen[0]["dataset"] == "my-split"
    assert seen[0]["data-dir"] == str(tmp_path / "data")
    assert "## my-split" in out.with_suffix(".md").read_text()


def test_a_missing_split_stops_the_board_before_any_cell(tmp_path, monkeypatch) -> None:
    (tmp_path / "data").mkdir()
    monkeypatch.setattr(lb, "run_cell", lambda cell, result=None: pytest.fail("a cell ran"))
    with pytest.raises(SystemExit, match="--datasets no-such-split: .*no-such-split"):
        lb.main(["--datasets", "no-such-split", "--data-dir", str(tmp_path / "data"),
                 "--protocols", "fedmf", "--out", str(tmp_path / "board.json")])
    with pytest.raises(SystemExit, match="--datasets ../x: .*no path separators"):
        lb.main(["--datasets", "../x", "--data-dir", str(tmp_path / "data"),
                 "--protocols", "fedmf", "--out", str(tmp_path / "board.json")])


def test_the_board_says_how_each_ceiling_was_obtained() -> None:
    """A FedMF cell whose reference recorded early stopping shows the rounds chosen; one
    without (an old fixed-budget reference) is named as not a tuned ceiling."""
    tuned = _cell("fedmf", {"ndcg@20": 0.40}, centralized={"ndcg@20": 0.42,
                                                          "tuned-rounds": 37.0})
    old = {**_cell("fedmf", {"ndcg@20": 0.35}, centralized={"ndcg@20": 0.27}),
           "dataset": "ml-1m"}
    text = report.markdown({"cells": {"ml-100k/fedmf": tuned, "ml-1m/fedmf": old}})
    line = next(x for x in text.splitlines() if x.startswith("- fedmf:"))
    assert "early stopping on a 10% validation split" in line and "8 candidates" in line
    assert "chosen: ML-100K 37 rounds" in line
    assert "ML-1M (users 1-2999): still the fixed budget" in line
    assert set(board.ORDER) <= set(report.CEILING)


def test_the_fedmf_line_names_the_chosen_user_and_item_steps() -> None:
    cen = {"ndcg@20": 0.42, "tuned-rounds": 12.0, "tuned-lr": 1e-3, "tuned-item-lr": 1e-4,
           "tuned-reg": 0.01, "tuned-valid": 0.2139, "tuned-at-edge": 1.0}
    text = report.markdown({"cells": {"ml-100k/fedmf": _cell("fedmf", {"ndcg@20": 0.40},
                                                          centralized=cen)}})
    line = next(x for x in text.splitlines() if x.startswith("- fedmf:"))
    assert ("(chosen: ML-100K 12 rounds at lr 0.001, item lr 0.0001, reg 0.01, validation "
            "NDCG@20 0.2139, at a grid edge)") in line


def test_privirec_gap_note_only_where_the_filters_stay_below_099(tmp_path) -> None:
    """The measured cause is quoted for a dataset whose federated filters are below 0.99 of
    centralized, with the numbers of the gap file; a dataset at 0.99 or above gets none."""
    import json

    gap = {"r": 256, "gap": {"1r": 0.9986}, "exact": {"gf-cf": 0.40},
           "rows": [{"L": 3, "p": 512, "ritz": True, "ndcg20": {"gf-cf": 0.398}},
                    {"L": 3, "p": 256, "ritz": False, "ndcg20": {"gf-cf": 0.30}}]}
    path = tmp_path / "rank_gap.json"
    path.write_text(json.dumps({"datasets": {"ml-1m": gap, "ml-100k": gap}}))
    low = {**_cell("privirec", {"gf-cf/ndcg@20": 0.39, "turbo-cf/ndcg@20": 0.3},
                   centralized={"gf-cf/ndcg@20": 0.40, "turbo-cf/ndcg@20": 0.3}),
           "dataset": "ml-1m"}
    fine = _cell("privirec", {"gf-cf/ndcg@20": 0.397}, centralized={"gf-cf/ndcg@20": 0.40})
    note = report._privirec_gap({"cells": {"ml-1m/privirec": low, "ml-100k/privirec": fine}},
                            path)
    assert note.count("reach") == 1 and "ML-1M (users 1-2999)" in note
    assert "0.975-0.975 of the exact ones" in note and "is 0.9986" in note
    assert "privirec-rank=512`) measured 0.995-0.995" in note
    assert report._privirec_gap({"cells": {"ml-100k/privirec": fine}}, path) == ""


def test_within_spread_is_a_rule_that_can_say_no() -> None:
    """A tie with the draws is within; a value far above their spread is not; too few draws
    are not judged."""
    draws = [0.98, 0.99, 1.00, 0.985, 0.995]
    assert report.within_spread(0.99, draws) is True
    assert report.within_spread(1.001, draws) is True  # inside mean + 2 sd (1.0047)
    assert report.within_spread(1.05, draws) is False
    assert report.within_spread(1.0, draws[:4]) is None


def test_privirec_cell_above_its_exact_filter_is_judged_against_the_draws(tmp_path) -> None:
    """A cell above its exact filter is called a draw of the spread only inside mean + 2 sd
    of the default setting's draws; one far above is called a beaten ceiling; draws at other
    settings do not count."""
    import json

    exact = {"gf-cf": 0.40, "bspm-em": 0.30}
    rows = [{"L": 3, "p": 256, "ritz": False, "seed": s,
             "ndcg20": {"gf-cf": 0.40 * x, "bspm-em": 0.30 * x}}
            for s, x in enumerate([0.98, 0.99, 1.00, 0.985, 0.995])]
    rows.append({"L": 3, "p": 512, "ritz": True, "seed": 0,
                 "ndcg20": {"gf-cf": 0.60, "bspm-em": 0.60}})
    path = tmp_path / "rank_gap.json"
    path.write_text(json.dumps({"datasets": {"ml-100k": {"r": 256, "exact": exact,
                                                         "rows": rows}}}))
    cen = {"gf-cf/ndcg@20": 0.40, "bspm-em/ndcg@20": 0.30}
    tie = _cell("privirec", {"gf-cf/ndcg@20": 0.4004, "bspm-em/ndcg@20": 0.29}, centralized=cen)
    note = report._privirec_spread({"cells": {"ml-100k/privirec": tie}}, path)
    assert "gf-cf 1.001 above the exact filter" in note and "5 draws" in note
    assert "gf-cf within mean + 2 sd" in note and "beyond" not in note
    high = _cell("privirec", {"gf-cf/ndcg@20": 0.42, "bspm-em/ndcg@20": 0.29}, centralized=cen)
    note = report._privirec_spread({"cells": {"ml-100k/privirec": high}}, path)
    assert "gf-cf beyond mean + 2 sd" in note and "within" not in note
    below = _cell("privirec", {"gf-cf/ndcg@20": 0.39, "bspm-em/ndcg@20": 0.29},
                  centralized=cen)
    assert report._privirec_spread({"cells": {"ml-100k/privirec": below}}, path) == ""


def test_privmvmf_copies_fedmvmfs_reference_only_for_the_same_keys() -> None:
    """The board copies a reference only from the named protocol's cell on the same dataset
    with the same keys (protocol and aggregator aside), never a copy of a copy."""
    cell = next(c for c in board.cells(["ml-100k"], ["privmvmf"]))
    source = {"config": {**cell.config, "protocol": "fedmvmf", "aggregator": "secagg+"},
              "centralized": {"ndcg@20": 0.87}, "popularity": {"ndcg@20": 0.8}}
    found = lb.shared_reference(cell, {"cells": {"ml-100k/fedmvmf": source}})
    assert found is not None and found[0] == "ml-100k/fedmvmf"
    other = {**source, "config": {**source["config"], "mvmf-top-k": 10}}
    assert lb.shared_reference(cell, {"cells": {"ml-100k/fedmvmf": other}}) is None
    copied = {**source, "centralized_from": "ml-100k/x"}
    assert lb.shared_reference(cell, {"cells": {"ml-100k/fedmvmf": copied}}) is None
    assert lb.shared_reference(cell, {"cells": {}}) is None
    fedmvmf = next(c for c in board.cells(["ml-100k"], ["fedmvmf"]))
    assert lb.shared_reference(fedmvmf, {"cells": {"ml-100k/fedmvmf": source}}) is None


def test_mvmf_cap_note_only_where_the_ceiling_chose_the_cap(tmp_path) -> None:
    """A ceiling whose epochs are the cap gets what training past it measured; one inside
    the cap gets no note."""
    import json

    past = {"epochs": [5, 10, 15, 20], "valid": [0.80, 0.85, 0.86, 0.855], "best_epochs": 15,
            "best_valid": 0.86}
    path = tmp_path / "ceiling.json"
    path.write_text(json.dumps({"datasets": {"ml-100k": {"tuning": {"max_epochs": 10},
                                                         "beyond_cap": past}}}))
    at_cap = _cell("fedmvmf", {"ndcg@20": 0.8}, centralized={"tuned-rounds": 10})
    note = report._mvmf_cap({"cells": {"ml-100k/fedmvmf": at_cap}}, "fedmvmf", path)
    assert "the chosen epochs are the cap (10)" in note and "costs 0.0100" in note
    inside = _cell("fedmvmf", {"ndcg@20": 0.8}, centralized={"tuned-rounds": 5})
    assert report._mvmf_cap({"cells": {"ml-100k/fedmvmf": inside}}, "fedmvmf", path) == ""
