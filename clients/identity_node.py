"""This node's signing identity and the federation roster (``fedrec/secure/identity.py``).

Node config ``identity-key`` (this node's PEM private key) and ``roster`` (the roster JSON)
give a deployed node its identity; both or neither. An item server holds no user rows: its
partition id is negative (-1 when its node config gives none; ``keygen --item-servers K``
makes keys for -1..-K). A roster that names roles (newer ``keygen``) must name this node's
config ``role`` for its partition; rosters without roles are accepted as before. Without them the node uses its
partition's simulated identity and the simulated roster, if its policy allows
(``allow-simulated-identity``). Either way the node signs every key it publishes and
checks every key it is handed, so a key the server substitutes is refused.

Each key is checked once per run (:meth:`NodeIdentity.check_once`): the node remembers, in
its state (the typed :class:`VerifiedKeys`, checked on reload), a digest of every signed key
it verified, bound to the roster, purpose, run and publishing node, so only those exact
bytes skip the signature check later in the run.

The roster also bounds every list of nodes the server hands this node (a run's node set,
the mail directory, a secret's peers; :meth:`NodeIdentity.bound_nodes`): each node of a run
signs as its own roster partition, so no list longer than the roster can be signed by all
it names, and such a list is refused on its length before it is copied or hashed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from flwr.app import RecordDict

from clients.policy import NodePolicy
from clients.state import NodeState
from fedrec.secure.identity import (
    IdentityError,
    Roster,
    SignedKey,
    SigningIdentity,
    simulated_roster_of,
)
from fedrec.wire.message import Message, WireError, message, reply

#: Node config keys of a deployed node's identity.
IDENTITY_KEY, ROSTER_KEY = "identity-key", "roster"
#: Node state ConfigRecord: the digests of the signed keys this node verified.
VERIFIED_STATE = "identity.verified"
_DIGEST_BYTES = 32  # SHA-256


# Typed so a corrupted or stale record is refused on reload naming the field, never used.
@message()
class VerifiedKeys(Message):
    """The signed keys this node verified in this run (node-state record
    :data:`VERIFIED_STATE`): their digests (:meth:`NodeIdentity.check_once`), packed into one
    value, as the mail directory packs its keys (``clients/sealed_node.py``): a state
    declares its fields, and a digest is no field name. Each check reads the value (its
    length checked) and scans it: 32 bytes per key verified this run, tens of microseconds
    at a thousand keys, below the Ed25519 verification it saves."""

    CONFIG = VERIFIED_STATE
    ARRAYS = f"{VERIFIED_STATE}.arrays"  # none: a node state names its own records

    digests: bytes = reply(doc="SHA-256 digests of the verified keys, 32 bytes each")

    def __post_init__(self) -> None:  # a cut blob would shift every later digest
        if len(self.digests) % _DIGEST_BYTES:
            raise WireError("VerifiedKeys field 'digests' must be whole 32-byte digests")

    def holds(self, digest: bytes) -> bool:
        """Whether ``digest`` is one of the digests (at a digest's boundary)."""
        at = self.digests.find(digest)
        while at >= 0 and at % _DIGEST_BYTES:
            at = self.digests.find(digest, at + 1)
        return at >= 0


@dataclass(frozen=True)
class NodeIdentity:
    """What this node signs with and checks against, and where they came from."""

    signer: SigningIdentity
    roster: Roster
    partition: int
    simulated: bool
    #: The node's policy (``load_identity``'s): its budget also bounds the keys and mail it
    #: keeps for other nodes (``clients/sealed_node.py``).
    policy: NodePolicy = NodePolicy()
    #: The node in refusals of its own state (``load_identity``'s ``who``).
    who: str = "this node"

    def sign(self, purpose: str, run_id: int, node_id: int, public_key: bytes) -> bytes:
        """``public_key`` signed as this node's, serialized for a record."""
        return self.signer.sign_key(purpose, run_id, node_id, self.partition,
                                    public_key).to_bytes()

    def check(self, purpose: str, run_id: int, node_id: int, blob: bytes) -> tuple[int, bytes]:
        """``(partition, public key)`` of a signed key ``node_id`` published; an error naming
        the node if the roster's key did not sign it."""
        signed = SignedKey.from_bytes(blob, f"node {node_id}")
        return signed.partition, self.roster.verify(purpose, run_id, node_id, signed)

    def bound_nodes(self, count: int, refuse: str, what: str,
                    error: type[Exception]) -> None:
        """Refuse (``error``, starting ``refuse``) a server-chosen list of ``count`` nodes,
        ``what``, longer than the roster: every node of a run signs as its own partition
        (:func:`signers_of`), so a longer list could never be signed by all it names. Checked
        on the length alone, before the list is copied, checked for distinctness or hashed
        (simulated identities: the simulated roster of the node's ``num-partitions``)."""
        most = len(self.roster.keys)
        if count > most:
            raise error(f"{refuse}: {what} lists {count:,} nodes, more than the {most} "
                        "partitions of its roster")

    def check_once(self, state: RecordDict, purpose: str, run_id: int, node_id: int,
                   blob: bytes) -> tuple[int, bytes]:
        """:meth:`check`, with the signature verified only the first time these bytes come
        from ``node_id`` for ``purpose`` in run ``run_id`` (remembered in node ``state``).

        Why: a node is handed the same peer keys with many messages of a run (the mail key
        of every peer it mails, at every sum); one Ed25519 verification each time was most
        of key setup at 100 nodes. The remembered digest covers the roster's fingerprint,
        purpose, run, node id and the whole signed key, so a different key, node, run or
        roster is never taken as verified: it is checked in full.
        """
        blob = bytes(blob)
        tag = hashlib.sha256(self.roster.fingerprint + repr(
            (str(purpose), int(run_id), int(node_id))).encode() + blob).digest()
        kept = NodeState(state, self.who)
        verified = kept.load_state(VerifiedKeys) or VerifiedKeys(digests=b"")
        if verified.holds(tag):
            signed = SignedKey.from_bytes(blob, f"node {node_id}")
            return signed.partition, signed.public_key
        out = self.check(purpose, run_id, node_id, blob)
        kept.save_state(VerifiedKeys(digests=verified.digests + tag))
        return out


def load_identity(cfg: Mapping[str, Any], policy: NodePolicy, who: str) -> NodeIdentity:
    """This node's identity from its node config ``cfg``, else the simulated one (if
    ``policy`` allows); ``who`` names the node in errors."""
    partition = int(cfg.get("partition-id", -1))
    key_path, roster_path = cfg.get(IDENTITY_KEY), cfg.get(ROSTER_KEY)
    if bool(key_path) != bool(roster_path):
        missing = ROSTER_KEY if key_path else IDENTITY_KEY
        raise IdentityError(f"{who}: node config sets "
                            f"'{IDENTITY_KEY if key_path else ROSTER_KEY}' but not "
                            f"'{missing}'; a node needs both its key and the roster")
    if key_path:
        signer, roster = _load_files(str(key_path), str(roster_path))
        if roster.keys.get(partition) != signer.public_bytes():
            raise IdentityError(f"{who}: its identity key (node config '{IDENTITY_KEY}') is "
                                f"not the key the roster (node config '{ROSTER_KEY}') lists "
                                f"for partition {partition}")
        _check_role(roster, partition, str(cfg.get("role", "") or ""), who)
        return NodeIdentity(signer, roster, partition, simulated=False, policy=policy,
                            who=who)
    policy.require("allow-simulated-identity", "simulated identities (public "
                        "deterministic signing keys; node config has no 'identity-key' and "
                        "'roster')", who)
    known = max(int(cfg.get("num-partitions", 0)), partition + 1)
    roster = simulated_roster_of(known)  # one cached object per process and size
    return NodeIdentity(SigningIdentity.simulated(partition), roster, partition, simulated=True,
                        policy=policy, who=who)


def _check_role(roster: Roster, partition: int, role: str, who: str) -> None:
    """Refuse a node whose config ``role`` is not the one the roster lists for its partition
    (e.g. an item server's key given to a user node); a roster or node config without a
    role says nothing to check."""
    listed = roster.roles.get(partition)
    if listed and role and listed != role:
        raise IdentityError(f"{who}: node config role {role!r}, but the roster (node config "
                            f"'{ROSTER_KEY}') lists partition {partition} as {listed!r}")


def _load_files(key_path: str, roster_path: str) -> tuple[SigningIdentity, Roster]:
    """The identity key and the roster, read again only when either file changes (a node
    handles many messages per run and would otherwise parse both for each)."""
    def stamp(path: str) -> tuple[int, int]:
        try:
            st = os.stat(path)
        except OSError:
            return (-1, -1)  # the loader below reports the missing file
        return (st.st_mtime_ns, st.st_size)

    return _load_files_cached(key_path, stamp(key_path), roster_path, stamp(roster_path))


@lru_cache(maxsize=8)
def _load_files_cached(key_path: str, _key_stamp: tuple[int, int], roster_path: str,
                       _roster_stamp: tuple[int, int]) -> tuple[SigningIdentity, Roster]:
    # errors name the node config keys, never the paths (they reach the server)
    return (SigningIdentity.load(key_path, f"node config '{IDENTITY_KEY}'"),
            Roster.load(roster_path, f"node config '{ROSTER_KEY}'"))


def signers_of(signatures: Iterable[tuple[int, bytes]], digest: bytes,
               check: Callable[[int, bytes], tuple[int, bytes]], refuse: str, what: str,
               error: type[Exception]) -> set[int]:
    """The roster partitions of the nodes that each signed exactly ``digest``: ``check(v,
    blob)`` gives node ``v``'s ``(partition, signed digest)``. Refuses (``error``, starting
    ``refuse``) a signature that fails the roster, one over another digest (the node was
    shown ``what`` differently), or a second one from the same partition (a reused one)."""
    partitions: set[int] = set()
    for v, blob in signatures:
        try:
            partition, signed = check(v, blob)
        except PermissionError as exc:
            raise error(f"{refuse}: {exc}") from None
        if signed != digest or partition in partitions:
            raise error(f"{refuse}: node {v} did not sign {what} (another was shown to it, "
                        "or its signature is reused)")
        partitions.add(partition)
    return partitions
