"""deploy/docker: the Compose file and the Dockerfile agree with the flwr 1.42 CLI they run.

No image is built here (Docker Hub is out of reach on the test machines): every service's
command is parsed by the argument parser of the Flower entry point its image runs, every
``--node-config`` by Flower's own parser and this app's node checks
(``tests/test_deployment_doc.py``), and the images, TLS, authentication, identities and
environment are checked against the installed flwr and ``deploy/local_deployment.py``.
``docker-compose config`` validates the file where it is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "deploy" / "docker"
sys.path.insert(0, str(REPO))

from deploy.local_deployment import LINK_FAST_ENV, NODE_FAST_ENV  # noqa: E402
from tests.test_deployment_doc import check_node_config  # noqa: E402

FLWR = version("flwr")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((DOCKER / "compose.yml").read_text(encoding="utf-8"))["services"]


def _stages() -> dict[str, str]:
    """Dockerfile stage name -> its FROM image, ARG defaults substituted."""
    text = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.M))
    stages = {}
    for image, name in re.findall(r"^FROM (\S+) AS (\w+)$", text, flags=re.M):
        stages[name] = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
    return stages


def _role(service: dict[str, Any]) -> str:
    """The Flower entry point a service runs: its image's (flwr/superlink) or its build
    target's ENTRYPOINT."""
    if "build" not in service:
        return service["image"].split("/")[1].split(":")[0]
    text = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    target = service["build"]["target"]
    body = text[text.index(f"AS {target}\n"):].split("\nFROM ")[0]
    return re.search(r'ENTRYPOINT \["flower-(\w+)"\]', body).group(1)


def _volumes(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path (the FEDREC_FEDERATION prefix dropped)."""
    out = {}
    for vol in service.get("volumes", []):
        host, container = vol.replace("${FEDREC_FEDERATION:-./federation}/", "").split(":")[:2]
        out[container] = host
    return out


def test_images_are_flowers_official_ones_at_the_installed_flwr(services) -> None:
    stages = _stages()
    assert stages["serverapp"] == f"flwr/superexec:{FLWR}-py3.11-ubuntu24.04"
    assert stages["supernode"] == f"flwr/supernode:{FLWR}-py3.11-ubuntu24.04"
    assert services["superlink"]["image"] == f"flwr/superlink:{FLWR}"
    for name, service in services.items():
        if "build" in service:
            assert service["build"]["target"] in stages, name
            assert service["image"].endswith(f":{FLWR}"), name
    ignore = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert ignore[ignore.index("*") - 1].startswith("#") and "**/*.key" in ignore


def test_every_command_parses_with_its_flower_entry_point(services) -> None:
    from flwr.supercore.cli.flower_superexec import _parse_args as superexec_parser
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    parsers = {"superlink": _parse_args_run_superlink, "superexec": superexec_parser,
               "supernode": _parse_args_run_supernode}
    roles = {name: _role(s) for name, s in services.items()}
    assert sorted(roles.values()) == ["superexec", "superlink", *["supernode"] * 5]
    for name, service in services.items():
        args = parsers[roles[name]]().parse_args([str(a) for a in service["command"]])
        mounts = _volumes(service)
        if roles[name] == "superlink":
            assert args.ssl_certfile and args.ssl_keyfile and args.ssl_ca_certfile
            assert not args.insecure and args.enable_supernode_auth
            assert args.isolation == "process" and args.database.startswith("/app/state/")
            assert not args.runtime_dependency_install
            link_port, secret = args.port, args.superexec_auth_secret_file
            assert {"/app/certificates", "/app/state", secret} <= set(mounts)
        elif roles[name] == "superexec":
            assert args.plugin_type == "serverapp" and not args.insecure
            assert args.root_certificates in mounts
            exec_address, exec_secret = args.runtime_api_address, args.superexec_auth_secret_file
        else:
            assert not args.insecure and args.root_certificates in mounts, name
            assert args.auth_supernode_private_key in mounts, name
            assert args.superlink == f"superlink:{link_port}", name
    assert exec_address == f"superlink:{link_port}" and exec_secret == secret


def test_one_supernode_per_partition_each_with_its_own_keys(services) -> None:
    nodes = {n: s for n, s in services.items() if _role(s) == "supernode"}
    seen_partitions, seen_keys = [], []
    for name, service in nodes.items():
        command = [str(a) for a in service["command"]]
        config = check_node_config(command[command.index("--node-config") + 1],
                                   f"compose.yml {name}")
        mounts = _volumes(service)
        role = str(config.get("role", "user"))
        partition = int(config.get("partition-id", -1 if role == "item-server" else 0))
        seen_partitions.append(partition)
        # its own identity key and auth key only, and the roster and data read-only
        own = mounts[str(config["identity-key"])]
        assert own == f"ids/{Path(str(config['identity-key'])).name}", name
        assert not any(h.startswith("ids/") and h not in (own, "ids/roster.json")
                       for h in mounts.values()), name
        auth = command[command.index("--auth-supernode-private-key") + 1]
        seen_keys.append(mounts[auth])
        assert all(v.endswith(":ro") for v in service["volumes"]), name
        assert int(config["num-partitions"]) == 4
    assert sorted(seen_partitions) == [-1, 0, 1, 2, 3]
    assert len(set(seen_keys)) == len(seen_keys)


def test_environment_is_the_local_deployments(services) -> None:
    text = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    supernode = text[text.index("AS supernode\n"):]
    for key, value in NODE_FAST_ENV.items():
        assert re.search(rf'{key}="?{re.escape(value)}"?', supernode), key
    for key, value in LINK_FAST_ENV.items():
        assert services["superlink"]["environment"][key] == value
        assert services["serverapp"]["environment"][key] == value
    assert services["serverapp"]["environment"]["FEDREC_RESULTS"] in _volumes(
        services["serverapp"])


def _flags(command: list[str]) -> set[str]:
    return {str(a) for a in command if str(a).startswith("--")}


def test_the_superlink_and_serverapp_run_the_flags_the_tested_local_deployment_runs(
        services, tmp_path: Path) -> None:
    """tests/test_deployment_failure.py deploys with ``isolation="process"`` and
    ``database=True``: the same flags as these two services, so those runs test them."""
    from deploy.local_deployment import LocalDeployment

    local = LocalDeployment(3, workdir=tmp_path, isolation="process", database=True)
    assert _flags(services["superlink"]["command"]) == _flags(local.superlink_args()[1:])
    assert _flags(services["serverapp"]["command"]) == _flags(local.serverapp_exec_args()[1:])


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not found")
def test_docker_compose_accepts_the_file() -> None:
    res = subprocess.run(["docker-compose", "-f", str(DOCKER / "compose.yml"), "config", "-q"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
