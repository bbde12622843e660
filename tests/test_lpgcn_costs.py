"""The LP-GCN node's cheaper state and mail formats (issue 44, LP-GCN costs): each gives back
exactly what was stored or sent, and a malformed letter is refused."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from clients.lpgcn import LosslessnessError, pack, state_array, state_view, unpack


@pytest.mark.parametrize("value", [np.arange(12.0).reshape(3, 4), np.zeros((0, 20)),
                                   np.array([True, False]), np.arange(5, dtype=np.uint64),
                                   np.array(7, dtype=np.int64), np.ones((2, 3), np.float32)])
def test_a_state_view_equals_flowers_reader(value) -> None:
    """The view of a stored array has numpy's dtype, shape and values, and is read-only."""
    array = Array(np.ascontiguousarray(value))
    view = state_view(array)
    expected = array.numpy()
    assert view.dtype == expected.dtype and view.shape == expected.shape
    np.testing.assert_array_equal(view, expected)
    assert not view.flags.writeable


def test_a_fortran_ordered_array_takes_numpys_reader() -> None:
    value = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(state_view(Array(value)), value)


def test_a_payload_gives_back_its_arrays() -> None:
    sent = {"x": np.arange(12.0).reshape(3, 4), "items": np.arange(3, dtype=np.int64),
            "none": np.zeros((0, 20), np.float32)}
    got = unpack(pack(sent))
    assert list(got) == list(sent)
    for name, value in sent.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape
        np.testing.assert_array_equal(got[name], value)


@pytest.mark.parametrize("cut", ["empty", "magic", "short", "long", "header", "object",
                                 "negative"])
def test_a_malformed_letter_is_refused(cut) -> None:
    good = pack({"x": np.ones((2, 2))})

    def framed(header: bytes) -> bytes:
        return b"LPGCN1" + len(header).to_bytes(4, "little") + header + bytes(32)

    blob = {"empty": b"", "magic": b"PK" + good[2:], "short": good[:-1], "long": good + b"\0",
            "header": framed(b"[[1]]"), "object": framed(b'[["x", "|O", [4]]]'),
            "negative": framed(b'[["x", "<f8", [-4]]]')}[cut]
    with pytest.raises(LosslessnessError, match="malformed LP-GCN mail"):
        unpack(blob)


@pytest.mark.parametrize("value", [np.arange(12.0).reshape(3, 4), np.zeros((0, 20)),
                                   np.arange(5, dtype=np.uint64), np.array(3.5)])
def test_a_state_array_is_the_array_flower_makes(value) -> None:
    """The cached .npy header gives Flower's own bytes, dtype and shape."""
    made, flowers = state_array(value), Array(value)
    assert (made.data, made.dtype, made.shape, made.stype) == (
        flowers.data, flowers.dtype, flowers.shape, flowers.stype)
    np.testing.assert_array_equal(state_view(made), value)
