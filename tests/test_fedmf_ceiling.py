"""benchmarks/fedmf_ceiling.py: its reading is computed from the numbers (validation first,
then where a test gap comes from), for results that hold and results that should not."""

from __future__ import annotations

from benchmarks import fedmf_ceiling as fc


def _result(fed_fit: tuple[float, float], cen_fit: tuple[float, float],
            board: tuple[float, float]) -> dict:
    chosen = {"tuned-lr": 1e-3, "tuned-item-lr": 3e-4, "tuned-reg": 0.01,
              "tuned-rounds": 35.0, "tuned-valid": cen_fit[0]}
    return {"datasets": {"ml-100k": {
        "federated_on_fit": dict(zip(("valid", "test"), fed_fit)),
        "centralized_on_fit": dict(zip(("valid", "test"), cen_fit)),
        "board": dict(zip(("federated", "centralized"), board)), "chosen": chosen}}}


def _reading(result: dict) -> str:
    return next(x for x in fc.markdown(result).splitlines() if x.startswith("Reading:"))


def test_reading_follows_the_numbers() -> None:
    ok = _reading(_result((0.20, 0.35), (0.21, 0.36), (0.40, 0.41)))
    assert "is a ceiling where it is chosen" in ok and "still leads" not in ok
    beaten = _reading(_result((0.22, 0.35), (0.21, 0.36), (0.40, 0.41)))
    assert "beats the reference on validation" in beaten
    disagree = _reading(_result((0.20, 0.37), (0.21, 0.36), (0.42, 0.41)))
    assert "validation and test disagree" in disagree
    retrain = _reading(_result((0.20, 0.35), (0.21, 0.36), (0.42, 0.41)))
    assert "only after both are retrained on all of train" in retrain
    text = fc.markdown(_result((0.20, 0.35), (0.21, 0.36), (0.40, 0.41)))
    assert "| fit | validation | 0.2000 | 0.2100 | 0.952 |" in text


def test_the_single_step_reference_is_reported_beside_the_federated_run() -> None:
    result = _result((0.2074, 0.35), (0.2138, 0.36), (0.4050, 0.4104))
    result["datasets"]["ml-100k"]["single_step"] = {"lr": 3.3e-4, "reg": 0.01, "rounds": 33,
                                                    "valid": 0.2085, "test": 0.3923}
    text = fc.markdown(result)
    assert ("lr 0.00033, reg 0.01, 33 rounds, validation 0.2085 (federated 0.2074), test after "
            "retraining on train 0.3923 (fed / cen 1.032)") in text
