"""Node identity: long-term Ed25519 signing keys and the federation roster.

Why: the server relays every public key the nodes agree keys with (the sealed relay's mail
keys, SecAgg+'s mask keys). Unsigned, it could hand each node a key of its own and stand in
the middle of every pairwise secret. So each node signs the keys it publishes with a
long-term Ed25519 key, and every node checks the keys it receives against a roster
(partition id -> public signing key) that reaches it out of band, never through the server.

What is signed (:func:`key_statement`): purpose, run id, the publishing node's Flower node id,
its partition id and the public key. A signature therefore cannot be moved to another run,
purpose or node id, and one partition cannot be claimed by two node ids.

Where identities come from:

- deployment: ``python -m fedrec.secure.identity keygen --partitions N [--item-servers K]
  --out DIR`` writes one private key per data holder's partition 0..N-1 (``node-<i>.key``)
  and per item server, partitions -1..-K (``item-server-<k>.key`` for partition -k; an item
  server holds no user rows, so its partition id is negative and -1 by default), PEM, mode
  0600, and ``roster.json`` with each entry's role (into a folder that has them, it keeps
  every key and roster entry and adds what is missing; ``--force`` makes all anew); each
  SuperNode gets ``--node-config
  "identity-key='DIR/<its key>' roster='DIR/roster.json'"`` (its own key file only) and its
  policy ``allow-simulated-identity=false``;
- simulation: Flower's simulation gives nodes no files, so a node without ``identity-key``
  uses the *simulated* identity of its partition, derived from a public constant. The
  checks run the same way, but anyone can compute these keys: they authenticate nothing,
  and runs that use them say so in their results (``privacy.identities``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

#: Roster file format version. ``roles`` is an optional member: rosters without it load,
#: and a reader that knows only ``nodes`` reads rosters with it.
ROSTER_VERSION = 1
#: Roles a roster entry may name (the node roles of ``clients/node.py``).
ROSTER_ROLES = ("user", "silo", "item-server")
#: Bytes of a :class:`SignedKey` (partition int32 | public key | signature).
SIGNED_KEY_BYTES = 4 + 32 + 64
_SIMULATED = b"fedrec-privacy/simulated-identity/v1|"


class IdentityError(PermissionError):
    """A key fails its signature check, or identities are misconfigured; names the node."""


def key_statement(purpose: str, run_id: int, node_id: int, partition: int,
                  public_key: bytes) -> bytes:
    """The bytes a node signs when it publishes ``public_key`` (see the module docstring)."""
    return (f"fedrec-key|v1|{purpose}|run={int(run_id)}|node={int(node_id)}|"
            f"partition={int(partition)}|").encode() + bytes(public_key)


@dataclass(frozen=True)
class SignedKey:
    """A published public key with the publisher's partition and signature (100 bytes)."""

    partition: int
    public_key: bytes
    signature: bytes

    def to_bytes(self) -> bytes:
        return int(self.partition).to_bytes(4, "big", signed=True) + self.public_key + \
            self.signature

    @classmethod
    def from_bytes(cls, blob: bytes, who: str) -> SignedKey:
        blob = bytes(blob)
        if len(blob) != SIGNED_KEY_BYTES:
            raise IdentityError(f"the key published for {who} is not signed ({len(blob)} "
                                f"bytes, a signed key has {SIGNED_KEY_BYTES})")
        return cls(int.from_bytes(blob[:4], "big", signed=True), blob[4:36], blob[36:])


class SigningIdentity:
    """A node's long-term Ed25519 key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key

    @classmethod
    def generate(cls) -> SigningIdentity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def simulated(cls, partition: int) -> SigningIdentity:
        """The public, deterministic identity of a simulated partition (authenticates
        nothing: see the module docstring); one object per partition and process."""
        return _simulated_identity(int(partition))

    @classmethod
    def load(cls, path: str | Path, label: str = "") -> SigningIdentity:
        """A PEM (PKCS#8) private key file, as ``keygen`` writes it. Errors name the file as
        ``label`` when given (a node passes its config key, so no path of its machine
        reaches the server), else by its path."""
        path = Path(path)
        name = label or f"identity key {path}"
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise IdentityError(f"{name}: cannot read an unencrypted PEM "
                                f"private key ({type(exc).__name__})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"{name}: not an Ed25519 private key")
        return cls(key)

    def save(self, path: str | Path) -> None:
        """Write the private key as PEM, readable by its owner only."""
        pem = self._key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)

    def public_bytes(self) -> bytes:
        return self._key.public_key().public_bytes(serialization.Encoding.Raw,
                                                   serialization.PublicFormat.Raw)

    def sign_key(self, purpose: str, run_id: int, node_id: int, partition: int,
                 public_key: bytes) -> SignedKey:
        """Sign ``public_key`` as published by this node (``node_id``, ``partition``)."""
        statement = key_statement(purpose, run_id, node_id, partition, public_key)
        return SignedKey(int(partition), bytes(public_key), self._key.sign(statement))


class Roster:
    """The federation's public signing keys by partition id, handed to nodes out of band.

    Read-only (``keys`` is a mapping proxy), so that one roster object can serve every
    message a node handles (:func:`simulated_roster`). ``roles`` gives the role of the
    partitions it names (:data:`ROSTER_ROLES`), so an operator sees who each key belongs to
    and a node whose config declares another role is refused; a roster may name none."""

    def __init__(self, keys: Mapping[int, bytes], source: str,
                 roles: Mapping[int, str] | None = None) -> None:
        self.keys: Mapping[int, bytes] = MappingProxyType(
            {int(p): bytes(k) for p, k in keys.items()})
        self.roles: Mapping[int, str] = MappingProxyType(
            {int(p): str(r) for p, r in (roles or {}).items()})
        self.source = source
        self._check_roles()
        digest = hashlib.sha256(b"fedrec-roster|v1|")
        for p, k in sorted(self.keys.items()):
            digest.update(int(p).to_bytes(8, "big", signed=True) + k)
        #: SHA-256 over every (partition, key): what a cache of verified keys is bound to.
        self.fingerprint = digest.digest()

    @property
    def _name(self) -> str:
        """The roster in errors: its label (a node's config key) or ``roster <path>``."""
        return self.source if self.source.startswith("node config") else f"roster {self.source}"

    def _check_roles(self) -> None:
        for p, role in self.roles.items():
            if role not in ROSTER_ROLES:
                raise IdentityError(f"{self._name}: partition {p} has role {role!r}, "
                                    f"expected one of {', '.join(ROSTER_ROLES)}")
            if p not in self.keys:
                raise IdentityError(f"{self._name}: 'roles' names partition {p}, "
                                    "which has no key in 'nodes'")

    @classmethod
    def simulated(cls, partitions: Iterable[int]) -> Roster:
        return simulated_roster(tuple(int(p) for p in partitions))

    @classmethod
    def load(cls, path: str | Path, label: str = "") -> Roster:
        """The roster JSON at ``path``; errors (and :attr:`source`) name it ``label`` when
        given (a node passes its config key), else its path."""
        path = Path(path)
        name = label or f"roster {path}"
        try:
            data = json.loads(path.read_text())
            if data.get("version") != ROSTER_VERSION:
                raise ValueError(f"'version' is {data.get('version')!r}, expected "
                                 f"{ROSTER_VERSION}")
            keys = {int(p): bytes.fromhex(k) for p, k in data["nodes"].items()}
            roles = {int(p): r for p, r in data.get("roles", {}).items()}
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
            raise IdentityError(f"{name}: expected JSON {{\"version\": "
                                f"{ROSTER_VERSION}, \"nodes\": {{\"<partition>\": "
                                f"\"<hex Ed25519 public key>\"}}, optional \"roles\": "
                                f"{{\"<partition>\": \"{'|'.join(ROSTER_ROLES)}\"}}}} "
                                f"({exc})") from None
        bad = [p for p, k in keys.items() if len(k) != 32]
        if bad:
            raise IdentityError(f"{name}: the key of partition {bad[0]} is not 32 bytes")
        return cls(keys, label or str(path), roles)

    def save(self, path: str | Path) -> None:
        data: dict[str, object] = {
            "version": ROSTER_VERSION,
            "nodes": {str(p): k.hex() for p, k in sorted(self.keys.items())}}
        if self.roles:
            data["roles"] = {str(p): r for p, r in sorted(self.roles.items())}
        Path(path).write_text(json.dumps(data, indent=2) + "\n")

    def verify(self, purpose: str, run_id: int, node_id: int, signed: SignedKey) -> bytes:
        """The public key ``node_id`` published, if its signature checks; else an error
        naming the node (the server substituted or forged it)."""
        who = f"node {node_id} (partition {signed.partition})"
        signing_key = self.keys.get(signed.partition)
        if signing_key is None:
            raise IdentityError(f"the key published for {who} claims a partition that is not "
                                "in the roster")
        statement = key_statement(purpose, run_id, node_id, signed.partition, signed.public_key)
        try:
            Ed25519PublicKey.from_public_bytes(signing_key).verify(signed.signature, statement)
        except InvalidSignature:
            raise IdentityError(f"the {purpose} key published for {who} does not carry that "
                                "partition's signature in the roster: substituted "
                                "or forged on the way; refusing it") from None
        return signed.public_key


@lru_cache(maxsize=4096)
def _simulated_identity(partition: int) -> SigningIdentity:
    seed = hashlib.sha256(_SIMULATED + str(partition).encode()).digest()
    return SigningIdentity(Ed25519PrivateKey.from_private_bytes(seed))


@lru_cache(maxsize=4096)
def _simulated_public(partition: int) -> bytes:
    return SigningIdentity.simulated(partition).public_bytes()


@lru_cache(maxsize=16)
def simulated_roster(partitions: tuple[int, ...]) -> Roster:
    """The simulated roster of ``partitions``, one object per process: a simulated node
    looks its roster up for every message it handles (the keys are public constants)."""
    return Roster({p: _simulated_public(p) for p in partitions}, "simulated")


@lru_cache(maxsize=16)
def simulated_roster_of(known: int) -> Roster:
    """The simulated roster of partitions -1 (the server) and 0..known-1, keyed by the count
    alone: a node looks it up for every message, and building the partition tuple to key
    :func:`simulated_roster` cost every message O(known) time and memory (36 KB at 1,024
    nodes: ``results/cross_device/secagg_scale.md``)."""
    return simulated_roster((-1, *range(int(known))))


def key_file_name(partition: int, role: str) -> str:
    """``node-<i>.key`` for a data holder's partition i, ``item-server-<k>.key`` for an item
    server's partition -k."""
    return f"item-server-{-partition}.key" if role == "item-server" else f"node-{partition}.key"


def federation_roles(partitions: int, item_servers: int = 0,
                     role: str = "user") -> dict[int, str]:
    """Partition -> role of a federation: data holders 0..partitions-1 with ``role`` (user or
    silo), item servers -1..-item_servers (item servers hold no user rows)."""
    if role not in ROSTER_ROLES or role == "item-server":
        raise ValueError(f"data holders' role must be user or silo, got {role!r}")
    if partitions < 0 or item_servers < 0 or partitions + item_servers < 1:
        raise ValueError(f"expected partitions >= 0 and item servers >= 0, at least one node "
                         f"in all; got {partitions} and {item_servers}")
    return {**{p: role for p in range(partitions)},
            **{-k: "item-server" for k in range(1, item_servers + 1)}}


def keygen(partitions: int, out: str | Path, item_servers: int = 0,
           role: str = "user", force: bool = False) -> Roster:
    """The identities of :func:`federation_roles` in ``out`` (:func:`key_file_name`) and the
    ``roster.json`` with every entry's key and role; see :func:`extend_identities`."""
    return extend_identities(partitions, out, item_servers, role, force)[0]


def extend_identities(partitions: int, out: str | Path, item_servers: int = 0,
                      role: str = "user", force: bool = False) -> tuple[Roster, list[int]]:
    """Make what the federation lacks in ``out``; (the roster, the partitions made).

    Never overwrites: a private key is a node's long-term identity, and the roster the
    holders already have must stay valid. A partition the roster (or a key file in ``out``)
    already has keeps its key; only the missing ones are made and added, and every entry of
    an existing roster stays, so ``--item-servers 1`` on a folder made for the data holders
    adds the item server. A key file that disagrees with the roster, or a role other than
    the roster's, is an error naming the partition. ``force`` makes every key anew and
    writes a roster of exactly this federation.
    """
    roles = federation_roles(partitions, item_servers, role)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    roster_path = out / "roster.json"
    keys: dict[int, bytes] = {}
    known_roles: dict[int, str] = {}
    if roster_path.is_file() and not force:
        existing = Roster.load(roster_path)
        keys, known_roles = dict(existing.keys), dict(existing.roles)
    made = []
    for p, r in roles.items():
        path = out / key_file_name(p, r)
        if known_roles.get(p, r) != r:
            raise ValueError(f"{roster_path} lists partition {p} as {known_roles[p]!r}, not "
                             f"{r!r}; pass --force to make a new federation (every key anew)")
        if path.is_file() and not force:
            public = SigningIdentity.load(path).public_bytes()
            if keys.setdefault(p, public) != public:
                raise ValueError(f"{path.name} does not hold the key {roster_path} lists for "
                                 f"partition {p}; move one of them away, or pass --force to "
                                 "make every key anew")
        elif p not in keys or force:  # a listed key without a file: its holder made it
            identity = SigningIdentity.generate()
            identity.save(path)
            keys[p] = identity.public_bytes()
            made.append(p)
        known_roles[p] = r
    roster = Roster(keys, str(roster_path), known_roles)
    tmp = roster_path.with_name(roster_path.name + ".tmp")
    roster.save(tmp)
    os.replace(tmp, roster_path)
    return roster, made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedrec.secure.identity",
                                     description="Make node identities and the roster.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("keygen", help="one Ed25519 key per node, plus roster.json")
    gen.add_argument("--partitions", type=int, required=True,
                     help="data holders: partitions 0..N-1 (key files node-<i>.key)")
    gen.add_argument("--item-servers", type=int, default=0,
                     help="item servers: partitions -1..-K (key files item-server-<k>.key)")
    gen.add_argument("--role", choices=("user", "silo"), default="user",
                     help="the data holders' role in the roster")
    gen.add_argument("--out", required=True)
    gen.add_argument("--force", action="store_true",
                     help="make every key anew and a roster of exactly this federation "
                          "(default: keep every key and roster entry in --out, add the "
                          "missing ones)")
    args = parser.parse_args(argv)
    try:
        roster, made = extend_identities(args.partitions, args.out, args.item_servers,
                                         args.role, args.force)
    except (ValueError, IdentityError) as exc:
        parser.error(str(exc))
    kept = sorted(set(roster.keys) - set(made))
    print(f"wrote {len(made)} node keys (partitions {sorted(made)}) and {roster.source} "
          f"({len(roster.keys)} nodes" + (f"; kept partitions {kept}" if kept else "")
          + "): give data holder i only node-<i>.key and item server k (partition-id=-k) "
          "only item-server-<k>.key, every SuperNode the roster")


if __name__ == "__main__":
    main()
