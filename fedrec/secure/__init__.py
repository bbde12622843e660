"""Privacy toolkit shared by every protocol: plain functions, no Flower messaging.

- ``masks``: AES-256-CTR mask expansion from a full 32-byte key (replaces Flower's
  ``pseudo_rand_gen``, which reduces the key to a 32-bit Mersenne-Twister seed).
- ``fixedpoint``: exact signed fixed-point encoding mod 2^64 / 2^32, with capacity checks.
- ``keys``: X25519 node keys, pairwise keys, AES-GCM sealing, secret relay, Shamir shares.
- ``he``: TenSEAL CKKS (dense packing, incremental encrypted sums) and BFV bit helpers.
- ``dp``: explicit DP mechanisms and a privacy ledger backed by Opacus accountants.

The message-level secure-aggregation protocol is built on top of these elsewhere.
"""
