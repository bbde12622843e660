"""Federated SVD's wire (FedPower and the two schemes of paper 002), declared once for the
strategy (``strategies/fedsvd.py``) and the node (``clients/fedsvd.py``).

Each synchronization sends the common basis ``Z`` (record ``arrays`` of
``fedrec/wire/request.py``) with the iteration window; every node runs its local power
iterations and answers with its weighted, noised update as a share of a sum
(``fedsvd_sync``), or with its last iterate when T is not a synchronization
(``fedsvd_output``). fedsvd-utility's noise removal (Algorithm 2, step 10) sends each node an
encrypted selection value and takes back encrypted products, both in record :data:`HE`. The
evaluation round sends the final basis; nodes answer with ranking metric sums.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from fedrec.recsys.power_svd import SCHEMES
from fedrec.wire.evaluation import RankingRequest
from fedrec.wire.message import Message, message, per_round, reply, run_fixed
from fedrec.wire.opt_in import OptIn, declare


class Action(StrEnum):
    """The node actions of federated SVD (``message_type = "query.<action>"``)."""

    SYNC = "fedsvd_sync"  # local iterations, then the weighted noisy update, as a sum
    OUTPUT = "fedsvd_output"  # the output rule when T is not a synchronization, as a sum
    NOISE_PRODUCT = "fedsvd_noise_product"  # Enc(b_i) x (w_i N_i): fedsvd-utility's removal
    EVALUATE = "fedsvd_evaluate"  # ranking metrics with the basis as a filter, as a sum


#: ConfigRecord of a noise-removal request (``t``, ``public-context``, ``selection``) and of
#: its reply (``products``).
HE = "fedsvd-he"

#: The common basis a request sends and a node's update: items x r (r is the server's rank).
_BASIS = ("items", "rank")


@message()
class BlockRequest(Message):
    """One block of local power iterations (t-from, t-to] from the common basis ``Z``, with
    the run's public parameters (``fedsvd-*`` run-config keys, paper 002's notation).

    Run-fixed: what the node's share of the noise and its weight stand on (scheme, node
    count, rows, ddp, seed). The rank, iteration window and privacy bounds are sent per
    request: the node never relies on them being the run's -- it clips to the declared
    bounds, charges its DP ledger by the basis it multiplies and bounds the work by its own
    policy on every request (tests/test_fedsvd.py replays a run's request with other values
    and expects an answer)."""

    Z: np.ndarray = per_round(shape=_BASIS, doc="the common basis")
    scheme: str = run_fixed(choices=SCHEMES)
    t_from: int = per_round(min=0, doc="the last iteration already done")
    t_to: int = per_round(min=1, doc="the block's last iteration")
    rows_total: int = run_fixed(min=1, doc="rows over all nodes (a node's weight s_i / s)")
    n_nodes: int = run_fixed(min=1, doc="nodes in the run (ddp's 1/sqrt(n))")
    k: int = run_fixed(name="fedsvd-k", min=1)
    rank: int = per_round(name="fedsvd-rank", min=1)
    iterations: int = per_round(name="fedsvd-iterations", min=1)
    sync_every: int = per_round(name="fedsvd-sync-every", min=1)
    sigma: float = per_round(name="fedsvd-sigma")
    sigma_server: float = run_fixed(name="fedsvd-sigma-server")
    z_hat: float = per_round(name="fedsvd-z-hat")
    m_hat: float = per_round(name="fedsvd-m-hat")
    delta: float = per_round(name="fedsvd-delta")
    ddp: bool = run_fixed(name="fedsvd-ddp")
    seed: int = run_fixed()


@message(Action.SYNC)
class SyncRequest(BlockRequest):
    """A block that ends in a synchronization: nodes answer :class:`SyncSum`."""


@message(Action.OUTPUT)
class OutputRequest(BlockRequest):
    """The output rule's last block (T is not a synchronization): :class:`OutputSum`."""


@message()
class SyncSum(Message):
    """A node's weighted noisy update w_i (M'_i Z D + N_i)."""

    Y: np.ndarray = reply(shape=_BASIS)


@message()
class OutputSum(Message):
    """A node's weighted aligned last iterate w_i Z_T^(i) D_{T+1}^(i)."""

    Z: np.ndarray = reply(shape=_BASIS)


@message(Action.NOISE_PRODUCT)
class NoiseProductRequest(Message):
    """fedsvd-utility's noise removal (Alg. 2 step 10): the server's public CKKS context and
    a fresh encryption of this node's selection value for synchronization ``t``."""

    CONFIG = HE

    t: int = per_round(min=1, doc="the synchronization whose noise is asked for")
    public_context: bytes = run_fixed(doc="the server's public CKKS context (one key pair "
                                      "per run)")
    selection: bytes = per_round(doc="Enc(b_i), fresh per node and synchronization")


@message()
class NoiseProducts(Message):
    """Enc(b_i) x (w_i N_i), re-randomized and flooded, in ciphertext chunks."""

    CONFIG = HE

    products: list[bytes] = reply()


@message(Action.EVALUATE)
class EvaluateRequest(RankingRequest):
    """The final basis as a low-pass filter; nodes answer ``fedrec.wire.evaluation.RankingSum``."""

    Z: np.ndarray = per_round(shape=_BASIS)


# -- node opt-ins FedSVD reads (fedrec/wire/opt_in.py; a node's operator sets them) ---------
OPT_INS = declare(
    OptIn("allow-noise-removal", False, "fedsvd-utility's homomorphic step: multiply this "
          "node's own Gaussian noise into the server's encrypted selection value; the server "
          "then learns every node's noise but one, and with every selection value 1 the "
          "noise-free aggregate. Answered only after this node's update went into a masked "
          "sum", "fedsvd"),
)
