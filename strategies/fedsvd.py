"""Federated SVD (paper 002, Liu, Pejo, Tang 2023): FedPower (Algorithm 1) and its utility-
and privacy-enhanced schemes (Algorithms 2 and 3) over horizontally partitioned rows.

One strategy class per scheme, sharing :class:`FedSvd` (math in ``fedrec/recsys/power_svd.py``,
node side ``clients/fedsvd.py``, decisions in ``docs/protocols/fedsvd.md``). Each
synchronization is ONE message round of work for the nodes: the server sends the common
basis, each node runs its p - 1 local power iterations and its part of the synchronization
and answers its weighted noisy update through the run's aggregator (SecAgg+ by default), so
the server learns only the weighted sum. Then:

- ``fedpower``: the server adds central noise and orthonormalizes. Alg. 1 scales the
  nodes' and the server's noise by ||Z||_max of the nodes' local bases; both use its public
  bound 1 instead (``power_svd.FEDPOWER_Z_MAX``), so a node's reply is its update alone and
  nothing in it depends on how the server chose the basis.
- ``fedsvd-utility``: one more round removes every node's noise but one (Alg. 2 steps 8-13):
  the server holds a CKKS key pair, sends each node a fresh encryption of its selection
  value (0 for one node j drawn from the OS CSPRNG, 1 for the others, replicated over the
  slots), each node multiplies its own weighted noise into it, re-randomizes and floods
  (``fedrec/secure/selection.py``), the server
  adds the products and decrypts the sum only: sum_{i != j} w_i N_i, which it subtracts.
- ``fedsvd-privacy``: no alignment; noise at every iteration; the server clips orth(Y).

The result Z_bar is evaluated as a recommender (each node scores its users by r_u Z Z^T,
learned as sums) and reported with the per-synchronization history and the DP accounting.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedrec.config import ConfigError, Key
from fedrec.recsys import power_svd as svd
from fedrec.recsys.metrics import evaluate_ranking
from fedrec.wire import fedsvd as fedsvd_wire
from fedrec.wire.fedsvd import (
    EvaluateRequest,
    NoiseProductRequest,
    NoiseProducts,
    OutputRequest,
    OutputSum,
    SyncRequest,
    SyncSum,
)
from strategies.base import Federation, ProtocolStrategy, RunOutcome
from strategies.policy_needs import PolicyNeed

log = logging.getLogger("fedrec")
#: The headline key of ``power_svd.accounting`` (None where no guarantee exists).
_EPSILON = "epsilon"

#: Run-config keys shared by the three schemes (paper 002, Sec. 6 defaults).
FEDSVD_KEYS: tuple[Key, ...] = (
    Key("fedsvd-k", 10, "k: the top eigenvectors wanted", min=1),
    Key("fedsvd-rank", 10, "r >= k: the iteration rank (columns of Z)", min=1),
    Key("fedsvd-iterations", 92, "T: local power iterations per node", min=1),
    Key("fedsvd-sync-every", 4, "p: synchronize every p iterations (floor(T/p) rounds)",
        min=1),
    Key("fedsvd-sigma", 0.1, "sigma: standard deviation of each node's Gaussian noise "
        "(FedPower: times the public bound 1 on ||Z||_max); 0 = no noise", min=0.0),
    Key("fedsvd-sigma-server", 0.1, "sigma': FedPower's central noise (times the public "
        "bound 1 on ||Z D||_max)", min=0.0),
    Key("fedsvd-z-hat", 0.2, "z_hat: fedsvd-privacy clips every entry of Z to [-z_hat, "
        "z_hat]", min=1e-12),
    Key("fedsvd-m-hat", 1.0, "m_hat: declared bound on the entries of every node's M'_i = "
        "M_i^T M_i / s_i (1 for 0/1 data); a node whose entries exceed it clips them (column "
        "scaling), never refuses. Enters the sensitivity 2 sqrt(r) m_hat z_hat and the sums' "
        "declared range", min=1e-12),
    Key("fedsvd-delta", 1e-5, "delta of the DP accounting", min=1e-300, max=0.5),
    Key("fedsvd-ddp", False, "fedsvd-privacy: distributed DP, each node's noise scaled by "
        "1/sqrt(n)"),
    Key("fedsvd-epsilon", 0.0, "fail before any message unless the scheme's total epsilon "
        "(basic composition, as the paper) is at most this; 0 = no requirement", min=0.0),
    Key("fedsvd-min-rows", 1, "the fewest rows a node must hold (the paper's pilot: 10)",
        min=1),
)


class FedSvd(ProtocolStrategy):
    """The common run of the three schemes; subclasses set :attr:`scheme`."""

    scheme = "fedpower"
    config_keys = FEDSVD_KEYS

    def __init__(self, cfg: Mapping[str, Any] | None = None) -> None:
        super().__init__(cfg)
        cfg = self.cfg
        self.params = svd.params_from_config(cfg)
        self.min_rows, self.epsilon = cfg["fedsvd-min-rows"], cfg["fedsvd-epsilon"]
        self.top_k = 20

    @property
    def unseeded_randomness(self) -> str:
        """Why this run is not reproducible by its seed ("" when it is): Gaussian noise from
        the discrete sampler's ChaCha20 stream keyed from the OS (``fedrec/dp_sampling.py``;
        never seeded: DP noise must be unpredictable, the server included) and, in
        fedsvd-utility, the kept node the server draws from the OS CSPRNG."""
        p = self.params
        reasons = []
        if p.sigma > 0 or (self.scheme == "fedpower" and p.sigma_server > 0):
            reasons.append(f"{self.scheme}'s Gaussian noise comes from the exact discrete "
                           "sampler (OS-keyed), which is never seeded (DP noise must be "
                           "unpredictable to "
                           "everyone, the server included)")
        if self.scheme == "fedsvd-utility":
            reasons.append("the node whose noise is kept is drawn from the OS CSPRNG")
        return "; ".join(reasons)

    # -- checks before any protocol message ------------------------------------------------
    def check_federation(self, fed: Federation) -> None:
        """Sizes, rows per node, the aggregator and a requested epsilon: clear errors."""
        try:
            self.params.check(fed.n_items)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        few = [fed.messenger.label(n) for n, i in fed.infos.items() if i.n_users < self.min_rows]
        if few:
            raise ConfigError(f"{', '.join(few)} hold(s) fewer than fedsvd-min-rows = "
                              f"{self.min_rows} rows")
        if self.scheme == "fedsvd-utility" and fed.aggregator.kind == "plain":
            raise ConfigError("fedsvd-utility needs a secure aggregator (secagg+ or ckks): with "
                              "aggregator = plain the server would see each node's noisy "
                              "update and then remove its noise")
        if self.epsilon > 0:
            acc = svd.accounting(self.scheme, self.params, len(fed.nodes),
                                 min(i.n_users for i in fed.infos.values()), opacus=False)
            total = acc.get(_EPSILON)
            if total is None or total > self.epsilon:
                raise ConfigError(
                    f"{self.scheme} cannot meet fedsvd-epsilon = {self.epsilon:g}: "
                    + (acc["reason"] if total is None else
                       f"its noise gives epsilon = {total:.4g} (basic composition over T = "
                       f"{self.params.T}); raise fedsvd-sigma to "
                       f">= {self.params.sigma * total / self.epsilon:.4g}"))

    def block_fields(self, fed: Federation, t_from: int, t_to: int) -> dict[str, Any]:
        """What every node needs for one block besides the basis (public parameters only),
        as the fields of a :class:`fedrec.wire.fedsvd.BlockRequest`."""
        p = self.params
        return dict(scheme=self.scheme, t_from=t_from, t_to=t_to,
                    rows_total=sum(i.n_users for i in fed.infos.values()),
                    n_nodes=len(fed.nodes), k=p.k, rank=p.r, iterations=p.T, sync_every=p.p,
                    sigma=p.sigma, sigma_server=p.sigma_server, z_hat=p.z_hat, m_hat=p.m_hat,
                    delta=p.delta, ddp=p.ddp, seed=p.seed)

    def max_abs(self, fed: Federation) -> float:
        """Range of every value a node sends: w_i |(M'_i Z D + N)_jl| <= sqrt(d r) m_hat
        (row norms of M'_i are <= sqrt(d) m_hat, columns of Z have norm <= 1, D is
        orthogonal) plus 12 noise standard deviations (exceeded with probability < 1e-32;
        FedPower's is sigma times the public bound on ||Z||_max)."""
        d, p = fed.n_items, self.params
        total = sum(i.n_users for i in fed.infos.values())
        w_max = fed.max_users / total
        std = p.sigma * (svd.FEDPOWER_Z_MAX if self.scheme == "fedpower" else 1.0)
        return float(w_max * (np.sqrt(d * p.r) * p.m_hat + 12.0 * max(std, 1e-12)))

    # -- the run ------------------------------------------------------------------------
    def run(self, fed: Federation) -> RunOutcome:
        self.check_federation(fed)
        p = self.params
        common = svd.initial_basis(fed.n_items, p.r, p.seed)
        max_abs = self.max_abs(fed)
        he = _ServerHe() if self.scheme == "fedsvd-utility" else None
        history = self.new_history()
        Z_bar = common
        last_Y: np.ndarray | None = None
        for t_from, t_to in svd.block_ends(p):
            block = self.block_fields(fed, t_from, t_to)
            if not p.is_sync(t_to):  # the output rule's last block
                Z_bar = fed.sum_of(OutputRequest(Z=common, **block), OutputSum, max_abs=1.0,
                                   phase="output").Z
                break
            total = fed.sum_of(SyncRequest(Z=common, **block), SyncSum, max_abs=max_abs,
                               phase="sync").Y
            removed = None
            if he is not None:
                removed = he.remove_noise(fed, t_to, total.shape)
                last_Y = total - removed
            else:
                last_Y = total
            common = svd.server_step(self.scheme, total, p, removed=removed)
            Z_bar = common
            history.append({"t": t_to, "sync": t_to // p.p})
            log.info("%s: synchronization %d of %d (t = %d)", self.scheme, t_to // p.p,
                     p.syncs, t_to)
        basis = svd.leading_basis(Z_bar, p.k)
        metrics = fed.evaluate_ranking(EvaluateRequest(Z=basis, top_k=self.top_k))
        privacy = {"dp": svd.accounting(self.scheme, p, len(fed.nodes),
                                        min(i.n_users for i in fed.infos.values())),
                   "fedsvd": {"scheme": self.scheme, "synchronizations": p.syncs,
                              **({"noise-removal": he.view} if he else {})}}
        return RunOutcome(metrics=metrics, history=history, privacy=privacy,
                          extra={"Z_bar": Z_bar, "basis": basis, "Y": last_Y})

    # -- the centralized reference -------------------------------------------------------
    def reference(self, data: Any) -> dict[str, float]:
        """Recall/NDCG of the exact top-k eigenspace of M' = M^T M / s (the truncated SVD),
        scored like the federated run: r_u Z* Z*^T."""
        Z, _ = svd.true_eigenspace(data.train, self.params.k)
        return evaluate_ranking(lambda rows: data.train[rows] @ Z @ Z.T, data.train,
                                data.test, k=self.top_k).means()


class _ServerHe:
    """Alg. 2's homomorphic step, server side (``fedrec/secure/selection.py``): the SERVER's
    CKKS key pair (as the paper's Paillier pair), one fresh encrypted selection value per
    node, the sum of the nodes' products, one decryption. The kept node j comes from the OS
    CSPRNG (never the public seed) and stays on the server; :attr:`view` records only what
    the results may show."""

    def __init__(self) -> None:
        from fedrec.secure import selection

        self.ctx = selection.make_context()
        self.public = selection.public_context_bytes(self.ctx)
        self.view: list[dict[str, Any]] = []

    def remove_noise(self, fed: Federation, t: int, shape: tuple[int, ...]) -> np.ndarray:
        from fedrec.secure import selection

        nodes = fed.nodes
        j = secrets.randbelow(len(nodes))
        requests = {node: NoiseProductRequest(
            t=t, public_context=self.public,
            selection=selection.selection_ciphertext(self.ctx, 0 if i == j else 1))
            for i, node in enumerate(nodes)}
        n_values = int(np.prod(shape))
        acc = selection.ProductSum(self.ctx, n_values)
        action = NoiseProductRequest.ACTION
        assert action is not None
        # one request per node (its own selection value): the messenger, not Federation.ask
        for node, reply in fed.messenger.iter_replies(
                action, {node: req.to_records() for node, req in requests.items()},
                phase="noise-removal"):
            label = fed.messenger.label(node)
            acc.add(NoiseProducts.from_records(reply, label).products, label)
        fed.messenger.ledger.mark("noise-removal", fedsvd_wire.HE, "encrypted")
        values = acc.decrypt()
        self.view.append({"t": t, "nodes": len(nodes),
                          "ciphertexts_per_node": selection.chunks_for(n_values)})
        return values.reshape(shape)


class FedPower(FedSvd):
    """FedPower (Guo et al. 2021; paper 002, Algorithm 1): the baseline."""

    scheme = "fedpower"


class FedSvdUtility(FedSvd):
    """Utility-enhanced FedPower (paper 002, Algorithm 2): SecAgg+ and HE noise removal."""

    scheme = "fedsvd-utility"

    def policy_needs(self) -> tuple[PolicyNeed, ...]:
        """The aggregator's needs and Algorithm 2's noise removal (``allow-noise-removal``)."""
        return (*super().policy_needs(), PolicyNeed(
            "allow-noise-removal", "noise removal (the server learns each node's noise but "
            "one)"))


class FedSvdPrivacy(FedSvd):
    """Privacy-enhanced FedPower (paper 002, Algorithm 3): clipping, noise every iteration."""

    scheme = "fedsvd-privacy"

    def policy_needs(self) -> tuple[PolicyNeed, ...]:
        """The aggregator's needs and a ``dp-budget`` of at least what every node charges
        for the run's T iterations (``release_epsilon``, whatever aggregator carries them),
        so a run the nodes would refuse is named before it starts."""
        p = self.params
        if p.sigma <= 0:
            return super().policy_needs()
        spent = svd.release_epsilon(p, p.sigma, p.r, p.T)
        return (*super().policy_needs(), PolicyNeed(
            "dp-budget", f"epsilon {spent:.6g} per node (fedsvd-privacy, {p.T} iterations)",
            spent))
