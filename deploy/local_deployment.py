"""Run this Flower app on a real SuperLink and real SuperNodes, all on 127.0.0.1.

What a deployment does, as separate processes (each in its own process group):

* ``flower-superlink`` serving its Fleet, Control and Runtime APIs on one HTTP(S) port
  (``--host/--port``; the per-API address flags are deprecated in flwr 1.42.0), TLS on by
  default with a CA made by ``deploy/make_certs.sh``, and Flower's own SuperNode
  authentication on (``--enable-supernode-auth``): each SuperNode's EC public key is
  registered with ``flwr supernode register`` before the node starts with its private key.
  Its auto-started SuperExec runs the ServerApp in a ``flwr-serverapp`` subprocess whose
  working directory is the SuperLink's and whose environment is the SuperLink's:
  ``FEDREC_RESULTS`` is set there, so the ServerApp writes
  ``<workdir>/results/runs/<run-name>.json``.
* one ``flower-supernode`` per data holder with ``--node-config "partition-id=i
  num-partitions=n identity-key=... roster=... allow-simulated-identity=false
  [data-dir=...]"`` and one per item server (``role="item-server"``, partition -k), its own
  Runtime API port, its own ``FLWR_HOME`` and its own ``FEDREC_CACHE`` (as if each were a
  different machine). Identities (``fedrec/secure/identity.py`` keygen) are made for the
  whole federation, item servers included, with each entry's role in ``roster.json``.
* ``flwr run <app> <connection> --run-config ...`` against a named SuperLink connection
  written to ``<workdir>/flwr-home/config.toml`` (``FLWR_HOME``), then ``flwr ls`` until the
  run is finished.

Every process's output goes to ``<log_dir>/<name>.log``; every process (and its children,
found through ``/proc``) is stopped on exit, error or timeout. A failure raises
:class:`DeploymentError` with the tail of the relevant logs.

Python::

    from deploy.local_deployment import run_deployed
    record = run_deployed({"protocol": "fedmf", "rounds": 3, "mf-dim": 4}, num_nodes=3)

Command line::

    python -m deploy.local_deployment --nodes 3 --set protocol=fedmf --set rounds=3 \
        --set mf-dim=4 [--insecure]
    python -m deploy.local_deployment --nodes 3 --item-servers 1 --set protocol=fedmvmf \
        --set implicit=false --node-set 0:allow-plain=true
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]
MAKE_CERTS = Path(__file__).resolve().parent / "make_certs.sh"
BIN = Path(sys.executable).parent
CONNECTION = "fedrec-local"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

#: Documented Flower environment settings that shorten a deployed message round, given to
#: the SuperNodes (and so to the SuperExec and ``flwr-clientapp`` processes they start) unless
#: ``flower_defaults=True``. docs/deployment.md, section 8, has the measured effect of each.
#:
#: * ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``: a SuperNode's SuperExec asks it for a pending
#:   task (a message to run) every 1 s by default, so each message waited 0-1 s (0.5 s on
#:   average) before its ``flwr-clientapp`` process was even started. At 0.2 s the wait is
#:   0.1 s on average for 5 local HTTP requests per second (~1-3 % of a core per node).
#:   Shorter intervals cost more CPU than they save on a 2-core machine; the SuperLink's own
#:   SuperExec keeps Flower's 1 s, since it starts only one ``flwr-serverapp`` per run.
#: * ``FLWR_TELEMETRY_ENABLED=0``: every Flower process (also each per-message
#:   ``flwr-clientapp``) otherwise posts usage events from a thread and, on exit, waits up to
#:   4 s for the post. Not on the round path (the reply is sent first; offline here the post
#:   fails in ~0.2 s), but a local trial has no business calling out, and a blackholed
#:   network would keep every finished ClientApp process alive 4 s longer.
#: * ``PYTHONDONTWRITEBYTECODE`` empty: each ``flwr-clientapp`` process imports the app from
#:   the node's unpacked FAB, and with that variable set (as in this project's CI and sandbox
#:   shells) no process keeps the bytecode it compiled, so every message recompiled the app:
#:   0.1-0.2 CPU-s of its ~0.9 s ``import fl_app.client_app``. Empty, the node's first
#:   message writes ``__pycache__`` beside the FAB's sources and later ones load it.
NODE_FAST_ENV: dict[str, str] = {
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
    "FLWR_TELEMETRY_ENABLED": "0",
    "PYTHONDONTWRITEBYTECODE": "",
}
#: What the SuperLink (and its SuperExec and ``flwr-serverapp``) get: no telemetry only.
LINK_FAST_ENV: dict[str, str] = {"FLWR_TELEMETRY_ENABLED": "0"}
#: Seconds between ``flwr ls`` calls while no awaited run has written its results (each call
#: is a new process importing Flower, ~1.9 CPU-s here; see :meth:`LocalDeployment.wait_all`).
STATUS_POLL_S = 30.0


class DeploymentError(RuntimeError):
    """The deployment or its run failed; the message carries the tails of the process logs."""


# ----------------------------------------------------------------------------- helpers
def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            children[int(fields[1])].append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    if not os.path.isdir("/proc"):
        return []
    children = _children_map()
    out, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _signal_pids(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def tail(path: Path, lines: int = 40) -> str:
    """Last ``lines`` lines of a log file, colour codes removed."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(_ANSI.sub("", text).splitlines()[-lines:])


def toml_value(value: Any) -> str:
    """A Python value as a TOML literal for ``--run-config`` / ``--node-config``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def config_arg(config: Mapping[str, Any]) -> str:
    """``{"rounds": 3, "dataset": "synthetic"}`` -> ``rounds=3 dataset="synthetic"``."""
    return " ".join(f"{key}={toml_value(value)}" for key, value in config.items())


def seconds_per_round(record: Mapping[str, Any]) -> dict[str, float]:
    """Wall seconds per protocol round from a results record, and per phase round.

    ``round`` is the sum of every phase's seconds except the one-off handshake, divided by
    the run config's ``rounds``; ``<phase>`` is that phase's seconds per synchronous round.
    """
    phases = record.get("communication", {}).get("phases", {})
    rounds = max(int(record.get("config", {}).get("rounds", 1)), 1)
    out = {name: st["seconds"] / max(st["rounds"], 1) for name, st in phases.items()}
    out["round"] = sum(st["seconds"] for name, st in phases.items() if name != "handshake") / rounds
    return out


def message_round_seconds(record: Mapping[str, Any], skip: Sequence[str] = ("handshake",)
                          ) -> float:
    """Mean wall seconds of one synchronous message round (server push to last reply).

    Sums every phase's seconds and rounds except ``skip`` (the handshake round also carries
    each node's first FAB download and unpacking, a one-off per run).
    """
    phases = record.get("communication", {}).get("phases", {})
    kept = [st for name, st in phases.items() if name not in skip]
    rounds = sum(int(st["rounds"]) for st in kept)
    if rounds == 0:
        raise ValueError("the record has no message rounds besides " + ", ".join(skip))
    return sum(float(st["seconds"]) for st in kept) / rounds


@dataclass
class Proc:
    """One started process and its log."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    log_file: TextIO
    args: list[str] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


# ----------------------------------------------------------------------------- deployment
class LocalDeployment:
    """A SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1; use as a context manager.

    Parameters
    ----------
    num_nodes : number of data holders; SuperNode ``i`` gets ``partition-id=i``.
    item_servers : SuperNodes with node config ``role="item-server"`` after the data
        holders: SuperNode ``num_nodes + k`` gets partition ``-(k+1)`` and the key
        ``item-server-<k+1>.key`` (FedMVMF/PrivMVMF's item server).
    workdir : folder for certificates, Flower homes, caches, results and logs
        (default: a new temp folder, kept afterwards so logs can be read).
    insecure : no TLS (``--insecure`` everywhere) -- local trials only.
    certs_dir : existing ``ca.crt``/``server.pem``/``server.key`` (default: made with
        ``deploy/make_certs.sh`` in ``<workdir>/certs``).
    data_dirs : optional ``data-dir`` per node (node config), e.g. each holder's own files.
    identities_dir : node identities (``node-<i>.key`` and ``roster.json``, as
        ``python -m fedrec.secure.identity keygen`` writes them; default: made in
        ``<workdir>/identities``). Each SuperNode gets its own key and the roster in its node
        config and ``allow-simulated-identity=false``, so every key it is relayed must carry
        the roster's signature.
    data : the data description every SuperNode's operator sets in its node config
        (``dataset`` and the split keys of ``datasets.data_keys``; a run config works):
        a node offers only this data and refuses a run that asks for another. Default: the
        run config's defaults (the synthetic data set).
    node_config : extra node config for every SuperNode, e.g. its privacy policy
        (``{"allow-plain": True}``; ``clients/policy.py``): the operator's choice, not the
        server's.
    node_configs : node config per SuperNode index (wins over ``node_config`` and the
        defaults), e.g. ``{2: {"allow-dropouts": True}}``; a ``partition-id`` or ``role``
        given here also picks that identity's key file.
    supernode_auth : Flower's SuperNode authentication (``--enable-supernode-auth``, keys
        registered with ``flwr supernode register``). Default: on with TLS; Flower refuses
        it without TLS.
    log_dir : where ``superlink.log``, ``supernode-<i>.log`` and ``flwr-*.log`` go
        (default ``<workdir>/logs``).
    app_dir : the Flower app (default: this repository).
    env : extra environment for every process; wins over :data:`NODE_FAST_ENV` and
        :data:`LINK_FAST_ENV`.
    flower_defaults : leave out :data:`NODE_FAST_ENV` / :data:`LINK_FAST_ENV` (Flower's own
        poll interval and telemetry), to measure what those settings change.
    install_dependencies : let the SuperLink ``uv sync`` the app's dependencies into a fresh
        env per run (flwr 1.42.0's default). Off here: the app and its dependencies are
        already installed in this interpreter's environment, and a sync would fetch torch.
    isolation : ``"subprocess"`` (the SuperLink starts its own SuperExec) or ``"process"``:
        the SuperLink with ``--isolation process`` and a SuperExec shared secret, and a
        separate ``flower-superexec --plugin-type serverapp`` with the same secret, as the
        ``superlink`` and ``serverapp`` services of ``deploy/docker/compose.yml`` run them.
    database : keep the SuperLink's state in ``<workdir>/superlink/state.db``
        (``--database``) instead of in memory.
    """

    def __init__(
        self,
        num_nodes: int = 3,
        *,
        item_servers: int = 0,
        node_configs: Mapping[int, Mapping[str, Any]] | None = None,
        supernode_auth: bool | None = None,
        workdir: str | Path | None = None,
        insecure: bool = False,
        certs_dir: str | Path | None = None,
        data_dirs: Sequence[str | Path | None] | None = None,
        identities_dir: str | Path | None = None,
        node_config: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
        log_dir: str | Path | None = None,
        app_dir: str | Path = REPO,
        env: Mapping[str, str] | None = None,
        install_dependencies: bool = False,
        startup_timeout: float = 90.0,
        flower_defaults: bool = False,
        isolation: str = "subprocess",
        database: bool = False,
    ) -> None:
        if num_nodes < 1:
            raise ValueError("num_nodes must be >= 1")
        if data_dirs is not None and len(data_dirs) != num_nodes:
            raise ValueError(f"data_dirs has {len(data_dirs)} entries for {num_nodes} nodes")
        if item_servers < 0:
            raise ValueError("item_servers must be >= 0")
        self.num_nodes = num_nodes
        self.item_servers = item_servers
        self.node_config = dict(node_config or {})
        from datasets import describe

        self.data = describe(data or {})  # a bad key fails here, before anything starts
        self.node_configs = {int(i): dict(c) for i, c in (node_configs or {}).items()}
        bad = sorted(i for i in self.node_configs if not 0 <= i < num_nodes + item_servers)
        if bad:
            raise ValueError(f"node_configs names SuperNode(s) {bad}; there are "
                             f"{num_nodes + item_servers} (0..{num_nodes + item_servers - 1})")
        if supernode_auth and insecure:
            raise ValueError("supernode_auth needs TLS: flower-superlink refuses "
                             "--enable-supernode-auth with --insecure")
        self.supernode_auth = (not insecure) if supernode_auth is None else supernode_auth
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fedrec-deploy-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.insecure = insecure
        self.certs_dir = Path(certs_dir) if certs_dir else self.workdir / "certs"
        self.data_dirs = list(data_dirs) if data_dirs is not None else [None] * num_nodes
        self.identities_dir = Path(identities_dir) if identities_dir else None
        self.log_dir = Path(log_dir) if log_dir else self.workdir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.app_dir = Path(app_dir).resolve()
        self.extra_env = dict(env or {})
        self.node_env = {} if flower_defaults else dict(NODE_FAST_ENV)
        self.link_env = {} if flower_defaults else dict(LINK_FAST_ENV)
        self.flower_defaults = flower_defaults
        self.install_dependencies = install_dependencies
        if isolation not in ("subprocess", "process"):
            raise ValueError(f"isolation must be 'subprocess' or 'process', got {isolation!r}")
        self.isolation = isolation
        self.database = database
        self.startup_timeout = startup_timeout
        self.results_dir = self.workdir / "results"
        self.cli_home = self.workdir / "flwr-home"
        self.superlink_port = 0
        self.superlink: Proc | None = None
        #: The ServerApp's SuperExec with ``isolation="process"`` (else the SuperLink's own).
        self.serverapp_exec: Proc | None = None
        self.nodes: list[Proc] = []
        self._cli_count = 0

    # -- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> LocalDeployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _env(self, defaults: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # flower-superexec etc.
        env.update(defaults or {})
        env.update(self.extra_env)
        env.update(extra)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _spawn(self, name: str, args: list[str], env: Mapping[str, str], cwd: Path) -> Proc:
        cwd.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed in stop())
        log_file.write(f"$ {' '.join(args)}\n")
        log_file.flush()
        popen = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=dict(env),
                                 cwd=str(cwd), start_new_session=True)
        return Proc(name, popen, log_path, log_file, args)

    def _make_certs(self) -> None:
        if all((self.certs_dir / f).is_file() for f in ("ca.crt", "server.pem", "server.key")):
            return
        if shutil.which("openssl") is None:
            raise DeploymentError("TLS needs openssl to make certificates (or pass insecure=True)")
        res = subprocess.run(["bash", str(MAKE_CERTS), str(self.certs_dir)],
                             capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise DeploymentError(f"make_certs.sh failed:\n{res.stdout}\n{res.stderr}")

    def start(self) -> None:
        """Start the SuperLink, then the SuperNodes; return when every node is connected."""
        if not self.insecure:
            self._make_certs()
        self.superlink_port = free_port()
        link_dir = self.workdir / "superlink"
        link_env = self._env(self.link_env, FLWR_HOME=str(link_dir / "flwr-home"),
                             FEDREC_RESULTS=str(self.results_dir))
        if self.isolation == "process":
            self.superexec_secret.parent.mkdir(parents=True, exist_ok=True)
            self.superexec_secret.write_bytes(os.urandom(32))
            self.superexec_secret.chmod(0o600)
        self.superlink = self._spawn("superlink", self.superlink_args(), link_env, link_dir)
        self._wait_for_log(self.superlink, "Application startup complete")
        if self.isolation == "process":
            self.serverapp_exec = self._spawn("superexec-serverapp", self.serverapp_exec_args(),
                                              link_env, link_dir)
        self._write_cli_config()

        self._identities()
        auth_keys = self._register_supernodes() if self.supernode_auth else {}
        for i in range(self.num_nodes + self.item_servers):
            node_dir = self.workdir / f"supernode-{i}"
            node_config = self.node_config_of(i)
            tls_node = (["--insecure"] if self.insecure
                        else ["--root-certificates", str(self.certs_dir / "ca.crt")])
            auth = (["--auth-supernode-private-key", str(auth_keys[i])] if i in auth_keys
                    else [])
            self.nodes.append(self._spawn(
                f"supernode-{i}",
                [str(BIN / "flower-supernode"), *tls_node, *auth,
                 "--superlink", f"127.0.0.1:{self.superlink_port}",
                 "--node-config", config_arg(node_config),
                 "--host", "127.0.0.1", "--port", str(free_port())],
                self._env(self.node_env, FLWR_HOME=str(node_dir / "flwr-home"),
                          FEDREC_CACHE=str(node_dir / "cache")),
                node_dir,
            ))
        for node in self.nodes:
            self._wait_for_log(node, "SuperNode ID:")

    @property
    def superexec_secret(self) -> Path:
        """The SuperLink <-> ServerApp SuperExec shared secret (``isolation="process"``)."""
        return self.workdir / "superlink" / "superexec.secret"

    def superlink_args(self) -> list[str]:
        """The ``flower-superlink`` command line (``deploy/docker/compose.yml``'s ``superlink``
        service runs the same flags; ``tests/test_docker.py`` compares them)."""
        tls = (["--insecure"] if self.insecure else [
            "--ssl-ca-certfile", str(self.certs_dir / "ca.crt"),
            "--ssl-certfile", str(self.certs_dir / "server.pem"),
            "--ssl-keyfile", str(self.certs_dir / "server.key")])
        deps = [] if self.install_dependencies else ["--disable-runtime-dependency-installation"]
        process = (["--isolation", "process", "--superexec-auth-secret-file",
                    str(self.superexec_secret)] if self.isolation == "process" else [])
        database = (["--database", str(self.workdir / "superlink" / "state.db")]
                    if self.database else [])
        return [str(BIN / "flower-superlink"), *tls, "--host", "127.0.0.1",
                "--port", str(self.superlink_port), *deps, *process, *database,
                *(["--enable-supernode-auth"] if self.supernode_auth else [])]

    def serverapp_exec_args(self) -> list[str]:
        """The ServerApp's ``flower-superexec`` with ``isolation="process"`` (the compose
        file's ``serverapp`` service)."""
        tls = (["--insecure"] if self.insecure
               else ["--root-certificates", str(self.certs_dir / "ca.crt")])
        return [str(BIN / "flower-superexec"), "--plugin-type", "serverapp",
                "--runtime-api-address", f"127.0.0.1:{self.superlink_port}", *tls,
                "--superexec-auth-secret-file", str(self.superexec_secret)]

    def node_config_of(self, index: int) -> dict[str, Any]:
        """SuperNode ``index``'s node config: partition, role, identity key and roster, no
        simulated identity, ``node_config`` and then ``node_configs[index]`` over them."""
        from fedrec.secure.identity import key_file_name

        ids = self.identities_dir or self.workdir / "identities"
        is_item_server = index >= self.num_nodes
        config: dict[str, Any] = {
            **self.data, "allow-simulated-identity": False, **self.node_config,
            "partition-id": -(index - self.num_nodes + 1) if is_item_server else index,
            "num-partitions": self.num_nodes}
        if is_item_server:
            config["role"] = "item-server"
        if not is_item_server and self.data_dirs[index]:
            config["data-dir"] = str(self.data_dirs[index])
        config.update(self.node_configs.get(index, {}))
        key = key_file_name(int(config["partition-id"]), str(config.get("role", "user")))
        config.setdefault("identity-key", str(ids / key))
        config.setdefault("roster", str(ids / "roster.json"))
        return config

    def _identities(self) -> Path:
        """The folder with every node's identity key and the roster (made if not given):
        keygen for the whole federation, item servers included, roles in the roster."""
        from fedrec.secure.identity import keygen

        if self.identities_dir is None:
            self.identities_dir = self.workdir / "identities"
            keygen(self.num_nodes, self.identities_dir, item_servers=self.item_servers)
        needed = [Path(self.node_config_of(i)["identity-key"]) for i in
                  range(self.num_nodes + self.item_servers)]
        missing = [p.name for p in needed if not p.is_file()]
        if missing or not (self.identities_dir / "roster.json").is_file():
            raise DeploymentError(f"identities_dir {self.identities_dir} lacks "
                                  f"{', '.join(missing) or 'roster.json'}")
        return self.identities_dir

    def _register_supernodes(self) -> dict[int, Path]:
        """Flower's SuperNode authentication: an EC (P-384) key pair per SuperNode in
        ``<workdir>/supernode-auth``, each public key registered with ``flwr supernode
        register`` (the registrations run side by side: each is a new process importing
        Flower). Returns each SuperNode's private key file."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        folder = self.workdir / "supernode-auth"
        folder.mkdir(parents=True, exist_ok=True)
        keys, calls = {}, {}
        for i in range(self.num_nodes + self.item_servers):
            private = ec.generate_private_key(ec.SECP384R1())
            keys[i] = folder / f"supernode-{i}"
            keys[i].write_bytes(private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption()))
            keys[i].chmod(0o600)
            public = keys[i].with_suffix(".pub")
            public.write_bytes(private.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
            calls[i] = subprocess.Popen(
                [str(BIN / "flwr"), "supernode", "register", str(public), CONNECTION,
                 "--name", f"supernode-{i}"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                cwd=str(self.app_dir), env=self._env(FLWR_HOME=str(self.cli_home)))
        for i, call in calls.items():
            out, _ = call.communicate(timeout=120)
            with open(self.log_dir / "flwr-cli.log", "a", encoding="utf-8") as fh:
                fh.write(f"$ flwr supernode register {keys[i]}.pub {CONNECTION}\n{out}\n")
            if call.returncode != 0:
                raise DeploymentError(f"`flwr supernode register` of supernode-{i} failed "
                                      f"({call.returncode}):\n{_ANSI.sub('', out)[-2000:]}")
        return keys

    def _wait_for_log(self, proc: Proc, needle: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            proc.log_file.flush()
            if needle in proc.log_path.read_text(encoding="utf-8", errors="replace"):
                return
            if not proc.alive:
                raise DeploymentError(f"{proc.name} exited with code {proc.popen.returncode} "
                                      f"during startup:\n{tail(proc.log_path)}")
            time.sleep(0.2)
        raise DeploymentError(f"{proc.name} did not start within {self.startup_timeout:g} s "
                              f"(no '{needle}' in its log):\n{tail(proc.log_path)}")

    def _write_cli_config(self) -> None:
        self.cli_home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink]", f'default = "{CONNECTION}"', "",
                 f"[superlink.{CONNECTION}]", f'address = "127.0.0.1:{self.superlink_port}"']
        if self.insecure:
            lines.append("insecure = true")
        else:
            lines.append(f"root-certificates = {json.dumps(str(self.certs_dir / 'ca.crt'))}")
        (self.cli_home / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def kill_node(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill SuperNode ``index`` and its children at once (a crashed data holder)."""
        self._kill_tree(self.nodes[index], sig)

    def _kill_tree(self, proc: Proc, sig: int) -> None:
        pids = [proc.popen.pid, *descendants(proc.popen.pid)]
        try:
            os.killpg(proc.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        _signal_pids(pids, sig)

    def stop(self, grace: float = 10.0) -> None:
        """Stop every process (nodes first): SIGTERM, then SIGKILL after ``grace`` s."""
        procs = [*self.nodes, *([self.serverapp_exec] if self.serverapp_exec else []),
                 *([self.superlink] if self.superlink else [])]
        trees = {p.name: [p.popen.pid, *descendants(p.popen.pid)] for p in procs}
        for proc in procs:
            if proc.alive:
                self._kill_tree(proc, signal.SIGTERM)
            else:  # its children (SuperExec, app processes) may outlive it
                _signal_pids(trees[proc.name][1:], signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.popen.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            _signal_pids(trees[proc.name] + descendants(proc.popen.pid), signal.SIGKILL)
            try:
                os.killpg(proc.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            proc.log_file.close()
        self.nodes = []
        self.superlink = None
        self.serverapp_exec = None

    # -- the flwr CLI --------------------------------------------------------------------
    def flwr(self, *args: str, timeout: float = 120.0, check: bool = True) -> str:
        """Run ``flwr <args>`` with this deployment's ``FLWR_HOME``; return its stdout."""
        self._cli_count += 1
        cmd = [str(BIN / "flwr"), *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                             cwd=str(self.app_dir), env=self._env(FLWR_HOME=str(self.cli_home)))
        with open(self.log_dir / "flwr-cli.log", "a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(cmd)}\n{res.stdout}{res.stderr}\n")
        if check and res.returncode != 0:
            raise DeploymentError(f"`flwr {' '.join(args)}` failed ({res.returncode}):\n"
                                  f"{_ANSI.sub('', res.stdout + res.stderr)[-3000:]}")
        return res.stdout

    def submit(self, run_config: Mapping[str, Any] | None = None) -> int:
        """``flwr run <app> fedrec-local --run-config ...``; returns the run id."""
        args = ["run", str(self.app_dir), CONNECTION, "--format", "json"]
        if run_config:
            args += ["--run-config", config_arg(run_config)]
        out = self.flwr(*args)
        payload = json.loads(out[out.index("{"):])
        if not payload.get("success") or not payload.get("run-id"):
            raise DeploymentError(f"flwr run did not start a run: {out}")
        return int(payload["run-id"])

    def status(self, run_id: int) -> dict[str, Any]:
        """The run's row from ``flwr ls --run-id`` (keys ``status``, ``status-details``, ...)."""
        out = self.flwr("ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        return json.loads(out[out.index("{"):])["runs"][0]

    def statuses(self) -> dict[int, dict[str, Any]]:
        """Every run's row from one ``flwr ls`` (run id -> row)."""
        out = self.flwr("ls", CONNECTION, "--format", "json")
        return {int(row["run-id"]): row for row in json.loads(out[out.index("{"):])["runs"]}

    def wait(self, run_id: int, timeout: float, poll: float = STATUS_POLL_S,
             results_path: Path | None = None) -> dict[str, Any]:
        """Wait until the run is finished; stop it and raise on timeout or failure.

        With ``results_path`` (where the ServerApp writes its record, also for a failed run)
        the wait watches that file and asks ``flwr ls`` once it is there, else every
        ``poll`` s; see :meth:`wait_all`.
        """
        row = self.wait_all({run_id: results_path}, timeout, poll)[run_id]
        if isinstance(row, DeploymentError):
            raise row
        return row

    def wait_all(self, runs: Mapping[int, Path | None], timeout: float,
                 poll: float = STATUS_POLL_S, first: bool = False
                 ) -> dict[int, dict[str, Any] | DeploymentError]:
        """Wait for every run (run id -> its results path or None); each run's final
        ``flwr ls`` row, or the :class:`DeploymentError` it failed or timed out with. With
        ``first``, return as soon as one or more have finished, with only those (or, on
        timeout, all of them).

        Every ``flwr`` CLI call is a new process that imports Flower (~1.9 CPU-s here), so
        the status is not polled every few seconds: the wait watches each run's results file
        (the ServerApp writes it as its last act, for a failed run too) and calls one
        ``flwr ls`` for all runs when a file appears (then at most every second until that
        run is marked finished), and every ``poll`` s otherwise (a ServerApp that died
        without writing). Runs not finished within ``timeout`` are stopped. A finished run's
        row also has ``waited-seconds``: from the call to the status that showed it finished.
        """
        start = time.monotonic()
        deadline = start + timeout
        pending = dict(runs)
        rows: dict[int, dict[str, Any]] = {}
        last_ls = -math.inf

        def done() -> bool:
            return (not pending or (first and len(pending) < len(runs))
                    or time.monotonic() >= deadline)

        while not done():
            if self.superlink is None or not self.superlink.alive:
                raise self.error(f"the SuperLink exited while runs {sorted(pending)} were going")
            if self.serverapp_exec is not None and not self.serverapp_exec.alive:
                raise self.error(f"the ServerApp's SuperExec exited while runs "
                                 f"{sorted(pending)} were going")
            now = time.monotonic()
            written = any(path is not None and path.is_file() for path in pending.values())
            if now - last_ls >= (1.0 if written else poll):
                last_ls = now
                for run_id, row in self.statuses().items():
                    if run_id not in pending:
                        continue
                    rows[run_id] = {**row, "waited-seconds": now - start}
                    if str(row.get("status", "")).startswith("finished"):
                        del pending[run_id]
            if not done():
                time.sleep(0.5)
        finished = [run_id for run_id in runs if run_id not in pending]
        out: dict[int, dict[str, Any] | DeploymentError] = {}
        for run_id in (finished if first and finished else runs):
            row = rows.get(run_id, {})
            if run_id in pending:
                self.flwr("stop", str(run_id), CONNECTION, check=False)
                out[run_id] = self.error(f"run {run_id} did not finish within {timeout:g} s "
                                         f"(last status: {row.get('status')})")
            elif row["status"] != "finished:completed":
                server_log = self.flwr("log", str(run_id), CONNECTION, "--show", timeout=60,
                                       check=False)
                tail_lines = "\n".join(server_log.strip().splitlines()[-30:])
                out[run_id] = self.error(
                    f"run {run_id} ended with status {row['status']}: "
                    f"{row.get('status-details')}\n--- ServerApp log (last 30 lines) ---\n"
                    f"{tail_lines}")
            else:
                out[run_id] = row
        return out

    def error(self, headline: str, lines: int = 30) -> DeploymentError:
        """A DeploymentError with the headline and the tail of every process log."""
        parts = [headline, f"(logs in {self.log_dir})"]
        procs = [*([self.superlink] if self.superlink else []),
                 *([self.serverapp_exec] if self.serverapp_exec else []), *self.nodes]
        for proc in procs:
            proc.log_file.flush()
            state = "running" if proc.alive else f"exited {proc.popen.returncode}"
            parts.append(f"--- {proc.name} ({state}), last {lines} lines ---\n"
                         f"{tail(proc.log_path, lines)}")
        return DeploymentError("\n".join(parts))

    def results_path(self, run_config: Mapping[str, Any] | None) -> Path:
        """Where the ServerApp writes this run config's results."""
        from fedrec.config import run_name
        from fl_app.registry import resolve_config

        return self.results_dir / "runs" / f"{run_name(resolve_config(run_config))}.json"

    def run(self, run_config: Mapping[str, Any] | None = None,
            timeout: float = 600.0) -> dict[str, Any]:
        """Submit a run, wait for it, return its results record (plus a ``deployment`` key)."""
        outcome = self.run_many({"run": run_config}, timeout=timeout)["run"]
        if isinstance(outcome, DeploymentError):
            raise outcome
        return outcome

    def run_many(self, run_configs: Mapping[str, Mapping[str, Any] | None],
                 timeout: float = 600.0, max_concurrent: int = 3
                 ) -> dict[str, dict[str, Any] | DeploymentError]:
        """Run every config, at most ``max_concurrent`` at a time, in the given order (a run is
        submitted when an earlier one finishes); ``timeout`` is for the lot.

        Returns, per key of ``run_configs``, the run's results record (plus a ``deployment``
        key) or the :class:`DeploymentError` it ended with, so one failed run does not hide
        the others. Runs go side by side: the SuperLink starts a ServerApp process per run,
        and a SuperNode pulls the pending messages of all runs one at a time, oldest first
        (flwr 1.42.0 ``start_client_internal``: pull one message, wait for its ClientApp's
        reply, push it, pull again; it sleeps 3 s only after an empty pull), so a node
        serves one run's message while another run's server computes. Each run needs its
        own ``run-name`` (its results file).

        Why a limit: a ServerApp process must report to the SuperLink within 30 s of its
        launch (flwr 1.42.0 ``claim_task``: ``HEARTBEAT_DEFAULT_INTERVAL``), else the SuperLink
        hands its task out again; ten ServerApps importing Flower at once on a loaded 2-core
        machine missed that, again and again, and no run started. A node also answers one
        message at a time, so each run waits behind the others' messages (mind the run
        config's reply ``timeout``). Runs are submitted one after another, never at once.
        """
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        paths = {key: self.results_path(cfg) for key, cfg in run_configs.items()}
        if len(set(paths.values())) != len(paths):
            raise ValueError("concurrent runs need distinct run names (results files): "
                             + ", ".join(f"{k}: {p.name}" for k, p in paths.items()))
        for path in paths.values():
            path.unlink(missing_ok=True)
        deadline = time.monotonic() + timeout
        queue = list(run_configs)
        going: dict[int, tuple[str, float]] = {}  # run id -> (key, submission time)
        out: dict[str, dict[str, Any] | DeploymentError] = {}
        while queue or going:
            while queue and len(going) < max_concurrent:
                key = queue.pop(0)
                if time.monotonic() >= deadline:
                    out[key] = DeploymentError(f"not submitted: the {timeout:g} s for all "
                                               f"runs were over")
                    continue
                going[self.submit(run_configs[key])] = (key, time.monotonic())
            if not going:
                break
            rows = self.wait_all({run_id: paths[key] for run_id, (key, _) in going.items()},
                                 max(deadline - time.monotonic(), 0.0), first=True)
            for run_id, row in rows.items():
                key, submitted = going.pop(run_id)
                if isinstance(row, DeploymentError):
                    out[key] = row
                elif not paths[key].is_file():
                    out[key] = self.error(f"run {run_id} completed but wrote no results at "
                                          f"{paths[key]}")
                else:
                    out[key] = self._record(run_id, row, paths[key],
                                            time.monotonic() - submitted)
        return {key: out[key] for key in run_configs}

    def _record(self, run_id: int, row: Mapping[str, Any], path: Path,
                wall: float) -> dict[str, Any]:
        """The record at ``path`` plus a ``deployment`` key; ``wall``: from its submission until
        it was seen finished."""
        record = json.loads(path.read_text(encoding="utf-8"))
        record["deployment"] = {
            "run_id": run_id, "status": row["status"], "wall_seconds": wall,
            "tls": not self.insecure, "num_supernodes": self.num_nodes + self.item_servers,
            "item_servers": self.item_servers, "supernode_auth": self.supernode_auth,
            "isolation": self.isolation, "database": self.database,
            "results_path": str(path), "log_dir": str(self.log_dir),
            "flower": {k: row.get(k) for k in ("elapsed", "network-traffic", "compute-time")},
        }
        return record


def run_deployed(run_config: Mapping[str, Any] | None = None, num_nodes: int = 3, *,
                 timeout: float = 600.0, **kwargs: Any) -> dict[str, Any]:
    """Start a deployment, run ``run_config`` on it, stop everything, return the record.

    ``kwargs`` go to :class:`LocalDeployment` (``item_servers``, ``node_configs``,
    ``supernode_auth``, ``insecure``, ``workdir``, ``log_dir``, ``data_dirs``, ``certs_dir``,
    ``env``, ``flower_defaults``, ``isolation``, ``database``).
    """
    kwargs.setdefault("data", run_config)  # the nodes' operator offers the run's data
    with LocalDeployment(num_nodes, **kwargs) as dep:
        return dep.run(run_config, timeout=timeout)


# ----------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the fedrec-privacy Flower app on a local SuperLink + SuperNodes "
                    "(real processes on 127.0.0.1) and print its results.")
    parser.add_argument("--nodes", type=int, default=3, help="number of data holders' SuperNodes")
    parser.add_argument("--item-servers", type=int, default=0,
                        help="SuperNodes with role item-server (partitions -1..-K), after "
                             "the data holders")
    parser.add_argument("--node-set", action="append", default=[], metavar="I:KEY=VALUE",
                        help="node config of SuperNode I (TOML value), repeatable, e.g. "
                             "2:allow-dropouts=true")
    parser.add_argument("--no-supernode-auth", action="store_true",
                        help="leave Flower's SuperNode authentication off (it is on with TLS)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="run-config override (TOML value), repeatable")
    parser.add_argument("--insecure", action="store_true", help="no TLS (local trial)")
    parser.add_argument("--certs-dir", help="existing ca.crt/server.pem/server.key")
    parser.add_argument("--data-dir", action="append", default=None,
                        help="data-dir node config, once per node in order")
    parser.add_argument("--workdir", help="working folder (default: new temp folder)")
    parser.add_argument("--log-dir", help="process logs (default: <workdir>/logs)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the run")
    parser.add_argument("--out", help="also write the results record here")
    parser.add_argument("--isolation", choices=("subprocess", "process"), default="subprocess",
                        help="process: a separate ServerApp SuperExec with a shared secret, "
                             "as deploy/docker/compose.yml runs it")
    parser.add_argument("--database", action="store_true",
                        help="keep the SuperLink's state in <workdir>/superlink/state.db")
    parser.add_argument("--flower-defaults", action="store_true",
                        help="do not apply NODE_FAST_ENV / LINK_FAST_ENV (Flower's default "
                             "poll interval and telemetry), to compare round times")
    args = parser.parse_args(argv)

    from fedrec.config import parse_assignments

    run_config = parse_assignments(args.set)
    node_configs: dict[int, dict[str, Any]] = {}
    for item in args.node_set:
        index, sep, assignment = item.partition(":")
        if not sep or not index.strip().isdigit():
            parser.error(f"--node-set {item!r}: expected I:KEY=VALUE")
        node_configs.setdefault(int(index), {}).update(parse_assignments([assignment]))
    try:
        record = run_deployed(run_config, args.nodes, timeout=args.timeout,
                              item_servers=args.item_servers, node_configs=node_configs,
                              supernode_auth=False if args.no_supernode_auth else None,
                              insecure=args.insecure, certs_dir=args.certs_dir,
                              data_dirs=args.data_dir, workdir=args.workdir,
                              log_dir=args.log_dir, flower_defaults=args.flower_defaults,
                              isolation=args.isolation, database=args.database)
    except DeploymentError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2, sort_keys=True))
    dep = record["deployment"]
    per_round = seconds_per_round(record)
    print(json.dumps({
        "metrics": record["metrics"],
        "rounds": record["config"]["rounds"],
        "seconds_per_round": per_round,
        "seconds_per_message_round": message_round_seconds(record),
        "synchronous_rounds": record["communication"]["total_rounds"],
        "server_seconds": record["seconds"],
        "wall_seconds": dep["wall_seconds"],
        "results_path": dep["results_path"],
        "log_dir": dep["log_dir"],
        "tls": dep["tls"],
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
