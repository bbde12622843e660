"""Masks, fixed point, sealing, secret relay and Shamir shares (fedrec.secure)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedrec.secure.fixedpoint import FixedPoint
from fedrec.secure.keys import (
    AuthenticationError,
    NodeKeys,
    combine_secret,
    open_sealed,
    seal,
    split_secret,
)
from fedrec.secure.masks import counter_block, derive_sum_key, expand_mask

KEY = bytes(range(32))


# ---------------------------------------------------------------------------- masks
def test_mask_is_deterministic_and_prefix_stable():
    a = expand_mask(KEY, 7, 1000)
    b = expand_mask(KEY, 7, 1000)
    assert a.dtype == np.uint64 and a.shape == (1000,)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(expand_mask(KEY, 7, 10), a[:10])
    assert a.flags.writeable


def test_mask_matches_documented_derivation():
    """AES-256-CTR keystream with IV = nonce(8 BE) || 0^8, read little-endian."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    assert counter_block(5) == (5).to_bytes(8, "big") + bytes(8)
    stream = Cipher(algorithms.AES(KEY), modes.CTR(counter_block(5))).encryptor().update(bytes(8 * 64))
    np.testing.assert_array_equal(expand_mask(KEY, 5, 64), np.frombuffer(stream, dtype="<u8"))
    np.testing.assert_array_equal(expand_mask(KEY, (5).to_bytes(8, "big"), 64), expand_mask(KEY, 5, 64))


def test_every_key_byte_matters():
    base = expand_mask(KEY, 0, 64)
    for pos in range(32):
        key = bytearray(KEY)
        key[pos] ^= 0x01
        assert not np.array_equal(expand_mask(bytes(key), 0, 64), base), f"key byte {pos} ignored"


def test_nonce_changes_mask():
    assert not np.array_equal(expand_mask(KEY, 0, 64), expand_mask(KEY, 1, 64))
    assert not np.array_equal(expand_mask(KEY, b"\x00" * 8, 64), expand_mask(KEY, b"\x00" * 7 + b"\x01", 64))


def test_bad_key_and_nonce_rejected():
    with pytest.raises(ValueError):
        expand_mask(b"short", 0, 4)
    with pytest.raises(ValueError):
        expand_mask(KEY, b"12345", 4)
    with pytest.raises(ValueError):
        expand_mask(KEY, 0, 4, modulus_bits=16)
    # other key lengths >= 16 are accepted via HKDF and give a different stream
    assert not np.array_equal(expand_mask(KEY + b"x", 0, 8), expand_mask(KEY, 0, 8))


def test_mask_uniformity():
    m = expand_mask(KEY, 3, 1_000_000)
    top = (m >> np.uint64(56)).astype(np.int64)
    counts = np.bincount(top, minlength=256)
    _, p = stats.chisquare(counts)
    assert p > 1e-4, p
    mean = float(np.mean(m.astype(np.float64) / 2.0**64))
    assert abs(mean - 0.5) < 0.002  # std of the mean is 0.29 / 1000
    m32 = expand_mask(KEY, 3, 200_000, modulus_bits=32)
    assert m32.max() < 2**32
    assert abs(float(np.mean(m32 / 2.0**32)) - 0.5) < 0.005


def test_large_mask_crosses_chunks():
    n = (1 << 20) // 8 * 3 + 5  # three 1 MiB chunks and a tail
    m = expand_mask(KEY, 9, n)
    assert m.shape == (n,)
    np.testing.assert_array_equal(m[: n - 5], expand_mask(KEY, 9, n - 5))


def test_derive_sum_key_separates_sums_and_purposes():
    k1 = derive_sum_key(KEY, 1, b"pairwise")
    assert len(k1) == 32
    assert k1 == derive_sum_key(KEY, 1, b"pairwise")
    assert k1 != derive_sum_key(KEY, 2, b"pairwise")
    assert k1 != derive_sum_key(KEY, 1, b"self")
    assert k1 != KEY


def test_masks_cancel_in_fixed_point_sum():
    rng = np.random.default_rng(0)
    fp = FixedPoint.for_sum(max_abs=10.0, n_summands=2)
    x1, x2 = rng.uniform(-10, 10, 5000), rng.uniform(-10, 10, 5000)
    m = expand_mask(derive_sum_key(KEY, 4, b"pairwise"), 4, 5000)
    y1 = fp.encode(x1) + m
    y2 = fp.encode(x2) - m
    total = fp.decode(y1 + y2)
    np.testing.assert_array_equal(total, fp.decode(fp.encode(x1) + fp.encode(x2)))
    assert np.max(np.abs(total - (x1 + x2))) <= fp.resolution
    # 32-bit ring: masks < 2^32 carried in uint64
    fp32 = FixedPoint.for_sum(max_abs=1.0, n_summands=2, modulus_bits=32)
    m32 = expand_mask(KEY, 4, 5000, modulus_bits=32)
    a, b = rng.uniform(-1, 1, 5000), rng.uniform(-1, 1, 5000)
    s = fp32.decode((fp32.encode(a) + m32) + (fp32.encode(b) - m32))
    assert np.max(np.abs(s - (a + b))) <= fp32.resolution


# ---------------------------------------------------------------------------- fixed point
def test_fixed_point_roundtrip_error():
    rng = np.random.default_rng(1)
    fp = FixedPoint(max_abs=100.0, frac_bits=24)
    x = rng.uniform(-100, 100, 100_000)
    x[:3] = [100.0, -100.0, 0.0]
    err = np.abs(fp.decode(fp.encode(x)) - x)
    assert err.max() <= fp.resolution / 2
    assert fp.resolution == 2.0**-24


def test_fixed_point_overflow_names_the_range_never_the_values_nor_their_count():
    fp = FixedPoint(max_abs=1.0)
    with pytest.raises(OverflowError, match=r"^values out of declared range max_abs = 1\.0$"):
        fp.encode(np.array([0.2, -1.5, 0.3]))
    with pytest.raises(ValueError):
        fp.encode(np.array([np.nan]))
    with pytest.raises(TypeError):
        fp.decode(np.array([1, 2], dtype=np.int64))


def test_fixed_point_capacity():
    fp = FixedPoint.for_sum(max_abs=1.0, n_summands=1000)
    # largest frac_bits with 1000 * 2^f <= 2^62: f = 52
    assert fp.frac_bits == 52
    fp.check_capacity(1000)
    fp.check_capacity(2000)  # the spare headroom bit
    with pytest.raises(OverflowError, match="summands"):
        fp.check_capacity(10_000)
    with pytest.raises(OverflowError):
        fp.encode(np.zeros(3), n_summands=10_000)
    with pytest.raises(OverflowError):
        FixedPoint.for_sum(max_abs=1.0, n_summands=1000, frac_bits=60)
    with pytest.raises(OverflowError):
        FixedPoint(max_abs=2.0**40, frac_bits=24)  # one value already needs 64 bits
    fp32 = FixedPoint.for_sum(max_abs=1.0, n_summands=100, modulus_bits=32)
    assert 100 * fp32.max_int <= 2**30 < 100 * round(2.0 ** (fp32.frac_bits + 1))
    # the sum of n values at the declared extreme decodes exactly
    n = 1000
    enc = fp.encode(np.full(n, -1.0))
    assert fp.decode(np.sum(enc, dtype=np.uint64).reshape(1))[0] == -n


# ---------------------------------------------------------------------------- sealing
def test_seal_roundtrip_and_tampering():
    key = derive_sum_key(KEY, 0, b"seal")
    blob = seal(key, b"hello secret", b"aad")
    assert open_sealed(key, blob, b"aad") == b"hello secret"
    assert seal(key, b"hello secret", b"aad") != blob  # fresh nonce
    for pos in (0, 12, len(blob) - 1):
        bad = bytearray(blob)
        bad[pos] ^= 0x80
        with pytest.raises(AuthenticationError, match="authentication"):
            open_sealed(key, bytes(bad), b"aad")
    with pytest.raises(AuthenticationError):
        open_sealed(key, blob, b"other aad")
    with pytest.raises(AuthenticationError):
        open_sealed(derive_sum_key(KEY, 1, b"seal"), blob, b"aad")
    with pytest.raises(AuthenticationError):
        open_sealed(key, blob[:20], b"aad")


def test_pairwise_keys_agree():
    a, b, c = NodeKeys(), NodeKeys(), NodeKeys()
    kab = a.shared_key(b.public_bytes(), b"run-1")
    assert len(kab) == 32
    assert kab == b.shared_key(a.public_bytes(), b"run-1")
    assert kab != a.shared_key(b.public_bytes(), b"run-2")
    assert kab != a.shared_key(c.public_bytes(), b"run-1")
    restored = NodeKeys.from_private_bytes(a.private_bytes())
    assert restored.public_bytes() == a.public_bytes()


# ---------------------------------------------------------------------------- Shamir
def test_shamir_threshold():
    secret = bytes(range(32))
    shares = split_secret(secret, threshold=3, n=5)
    assert len(shares) == 5
    assert combine_secret(shares[:3]) == secret
    assert combine_secret([shares[4], shares[1], shares[2]]) == secret
    assert combine_secret(shares) == secret
    with pytest.raises(ValueError, match="threshold is 3, got 2"):
        combine_secret(shares[:2])
    with pytest.raises(ValueError, match="threshold is 3, got 2"):
        combine_secret([shares[0], shares[0], shares[1]])
    with pytest.raises(ValueError):
        split_secret(secret, threshold=6, n=5)


def test_shamir_any_threshold_subset_reconstructs_every_length():
    import itertools
    import os

    for nbytes in (1, 16, 31, 32, 33, 100):
        secret = os.urandom(nbytes)
        shares = split_secret(secret, threshold=3, n=6)
        for subset in itertools.combinations(shares, 3):
            assert combine_secret(list(subset)) == secret
    zero = bytes(32)  # a secret of zeros still round-trips (no leading-zero loss)
    assert combine_secret(split_secret(zero, 2, 3)[1:]) == zero


def test_shamir_shares_of_one_point_look_uniform_whatever_the_secret():
    """t-1 = 1 share of a 2-of-n split: its limbs are uniform over the field, independent of
    the secret (mean of uniform GF(p) elements ~ p/2 for an all-zero and an all-ones secret)."""
    from fedrec.secure import shamir

    for secret in (bytes(32), b"\xff" * 32):
        ys = np.stack([np.frombuffer(split_secret(secret, 2, 2)[0][7:], "<u4")
                       for _ in range(400)]).astype(np.float64)
        assert abs(ys.mean() / shamir.P - 0.5) < 0.03


def test_shamir_rejects_mixed_or_malformed_shares():
    a, b = split_secret(b"x" * 32, 2, 3), split_secret(b"y" * 31, 2, 3)
    with pytest.raises(ValueError, match="disagree"):
        combine_secret([a[0], b[1]])
    with pytest.raises(ValueError, match="malformed"):
        combine_secret([a[0], a[1][:-1]])


def test_shamir_is_fast_at_100_holders():
    import time

    t0 = time.perf_counter()
    shares = [split_secret(bytes(32), 51, 100) for _ in range(16)]
    split_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in shares:
        combine_secret(s[:51])
    combine_s = time.perf_counter() - t0
    # 16 seeds among 100 holders, and 16 reconstructions from 51 shares: a node's share round
    # and the server's unmasking of 16 survivors (Flower's GF(2^128) Shamir took seconds).
    assert split_s < 0.5 and combine_s < 0.5, (split_s, combine_s)
