"""TenSEAL helpers (fedrec.secure.he): packed CKKS sums, public context, BFV bits."""

from __future__ import annotations

import numpy as np
import pytest

from fedrec.secure import he


@pytest.fixture(scope="module")
def ctx():
    return he.make_secret_context()


@pytest.fixture(scope="module")
def pub(ctx):
    return he.public_context_bytes(ctx)


def test_encrypted_sum_of_20_packed_vectors(ctx, pub):
    rng = np.random.default_rng(0)
    n, clients = 25_000, 20
    client_ctx = he.load_context(pub)  # clients encrypt with the public key only
    acc = he.EncryptedSum(pub)
    total = np.zeros(n)
    for _ in range(clients):
        x = rng.uniform(-1.0, 1.0, n)
        total += x
        chunks = he.encrypt_packed(client_ctx, x)
        assert len(chunks) == int(np.ceil(n / 4096))
        acc.add(chunks)
        assert acc.held_ciphertexts == len(chunks)  # only the running total is kept
    assert acc.count == clients
    got = he.decrypt_packed(ctx, acc.result(), n)
    assert np.max(np.abs(got - total)) < 1e-6


def test_public_context_cannot_decrypt(ctx, pub):
    public = he.load_context(pub)
    assert not public.has_secret_key()
    chunks = he.encrypt_packed(public, np.arange(10.0))
    with pytest.raises(ValueError):
        he.decrypt_packed(public, chunks, 10)
    import tenseal as ts

    with pytest.raises(ValueError):
        ts.ckks_vector_from(public, chunks[0]).decrypt()
    with pytest.raises(ValueError, match="secret key"):
        he.EncryptedSum(he.secret_context_bytes(ctx))


def test_secret_context_roundtrip(ctx):
    restored = he.load_context(he.secret_context_bytes(ctx))
    x = np.linspace(-1, 1, 100)
    np.testing.assert_allclose(he.decrypt_packed(restored, he.encrypt_packed(ctx, x), 100), x, atol=1e-7)


def test_encrypted_sum_rejects_mismatched_layout(pub):
    public = he.load_context(pub)
    acc = he.EncryptedSum(pub)
    acc.add(he.encrypt_packed(public, np.ones(5000)))
    with pytest.raises(ValueError, match="chunks"):
        acc.add(he.encrypt_packed(public, np.ones(100)))


def test_plain_times_cipher(ctx, pub):
    rng = np.random.default_rng(1)
    n = 5000
    x, w = rng.uniform(-1, 1, n), rng.uniform(-2, 2, n)
    public = he.load_context(pub)
    prod = he.plain_times_cipher(public, he.encrypt_packed(public, x), w)
    np.testing.assert_allclose(he.decrypt_packed(ctx, prod, n), x * w, atol=1e-5)


def test_bfv_selection_bits():
    bctx = he.make_bfv_context()
    bpub = he.public_context_bytes(bctx)
    server = he.load_context(bpub)
    noise = np.array([[5, -7, 123456789, -3], [2, 2, -2, 2], [1, 1, 1, 1]], dtype=np.int64)
    bits = np.array([1, 0, 1])  # client 1 is the one whose noise stays
    acc = he.EncryptedSum(bpub, scheme="bfv")
    for i in range(3):
        enc_bit = he.encrypt_bits(server, np.full(4, bits[i]))
        acc.add(he.plain_times_cipher(server, enc_bit, noise[i], scheme="bfv"))
    np.testing.assert_array_equal(he.decrypt_ints(bctx, acc.result(), 4), noise[0] + noise[2])
    with pytest.raises(ValueError):
        he.encrypt_bits(bctx, np.array([0, 2]))
