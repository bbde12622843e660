"""This node's signing identity and the federation roster (``fl_app/secure/identity.py``).

Node config ``identity-key`` (this node's PEM private key) and ``roster`` (the roster JSON)
give a deployed node its identity; both or neither. Without them the node uses its
partition's simulated identity and the simulated roster, if its policy allows
(``allow-simulated-identity``). Either way the node signs every key it publishes and
checks every key it is handed, so a key the server substitutes is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clients.policy import NodePolicy
from fl_app.secure.identity import IdentityError, Roster, SignedKey, SigningIdentity

#: Node config keys of a deployed node's identity.
IDENTITY_KEY, ROSTER_KEY = "identity-key", "roster"


@dataclass(frozen=True)
class NodeIdentity:
    """What this node signs with and checks against, and where they came from."""

    signer: SigningIdentity
    roster: Roster
    partition: int
    simulated: bool

    def sign(self, purpose: str, run_id: int, node_id: int, public_key: bytes) -> bytes:
        """``public_key`` signed as this node's, serialized for a record."""
        return self.signer.sign_key(purpose, run_id, node_id, self.partition,
                                    public_key).to_bytes()

    def check(self, purpose: str, run_id: int, node_id: int, blob: bytes) -> tuple[int, bytes]:
        """``(partition, public key)`` of a signed key ``node_id`` published; an error naming
        the node if the roster's key did not sign it."""
        signed = SignedKey.from_bytes(blob, f"node {node_id}")
        return signed.partition, self.roster.verify(purpose, run_id, node_id, signed)


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
        signer, roster = SigningIdentity.load(str(key_path)), Roster.load(str(roster_path))
        if roster.keys.get(partition) != signer.public_bytes():
            raise IdentityError(f"{who}: its identity key {key_path} is not the key the "
                                f"roster {roster_path} lists for partition {partition}")
        return NodeIdentity(signer, roster, partition, simulated=False)
    policy.require("allow-simulated-identity", "simulated identities (public "
                        "deterministic signing keys; node config has no 'identity-key' and "
                        "'roster')", who)
    known = max(int(cfg.get("num-partitions", 0)), partition + 1)
    roster = Roster.simulated([-1, *range(known)])
    return NodeIdentity(SigningIdentity.simulated(partition), roster, partition, simulated=True)
