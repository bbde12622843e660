"""docs/deployment.md's commands are what Flower 1.42 accepts, in an order that works.

Each ``--node-config`` the doc gives is parsed by Flower's own parser (what
``flower-supernode`` runs at start: an unquoted string value stops it there) and by this
app's node policy; each names the data root every holder needs; the connection entry comes
before the first ``flwr`` command that needs it; the SuperLink command shows ``--database``
and parses with ``flower-superlink``'s own argument parser."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "deployment.md"
sys.path.insert(0, str(REPO))


def code_blocks(text: str, lang: str) -> list[str]:
    """The fenced ``lang`` blocks of a Markdown text (indented ones too)."""
    return [re.sub(r"^ {0,4}", "", b, flags=re.M)
            for b in re.findall(rf"^ *```{lang}\n(.*?)^ *```", text, flags=re.S | re.M)]


def commands(block: str) -> list[list[str]]:
    """The block's shell commands, continuation lines joined, comments dropped, split as
    the shell would (leading VAR=value assignments removed)."""
    out = []
    for line in re.sub(r"\\\n", " ", block).splitlines():
        words = shlex.split(line, comments=True)
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words.pop(0)
        if words:
            out.append(words)
    return out


def doc_commands(program: str) -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8")
    return [c for b in code_blocks(text, "bash") for c in commands(b) if c[0] == program]


def node_config_of(command: list[str]) -> str:
    return command[command.index("--node-config") + 1]


def check_node_config(text: str, where: str) -> dict[str, object]:
    """A node config as ``flower-supernode`` parses it, checked as this app's node reads it:
    its policy keys, role, partition, identity files, data root."""
    import click
    from flwr.common.config import parse_config_args

    from clients.policy import NodePolicy
    from fedrec.secure.identity import ROSTER_ROLES, key_file_name

    try:
        config = parse_config_args([text])
    except click.ClickException as exc:
        raise AssertionError(f"{where}: Flower refuses --node-config {text!r}: "
                             f"{exc.format_message()}") from None
    NodePolicy().merged(config, where)  # a bad policy value raises, naming the key
    role = str(config.get("role", "user"))
    assert role in ROSTER_ROLES, f"{where}: role {role!r}"
    partition = int(config.get("partition-id", -1 if role == "item-server" else 0))
    assert (partition < 0) == (role == "item-server"), f"{where}: partition {partition}, {role}"
    assert Path(str(config["identity-key"])).name in (key_file_name(partition, role),
                                                      "node-0.key"), where
    assert str(config["roster"]).endswith("roster.json"), where
    assert config["allow-simulated-identity"] is False, where
    assert "data-dir" in config, (f"{where}: every holder, the item server too, needs the "
                                  "data root with the complete dataset file")
    from datasets import describe

    assert "dataset" in config, (f"{where}: a node offers only the data its operator "
                                 "describes (dataset=...), never the server's")
    describe(config)  # its data keys parse (a bad value raises, naming the key)
    return config


def test_every_node_config_in_the_doc_parses_as_flower_supernode_reads_it() -> None:
    nodes = doc_commands("flower-supernode")
    configs = [check_node_config(node_config_of(c), f"docs/deployment.md: {' '.join(c)[:60]}")
               for c in nodes if "--node-config" in c]
    assert len(configs) >= 3
    assert any(c.get("role") == "item-server" for c in configs)
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    for command in nodes:
        if "..." not in command:  # the fragments that only show one flag
            _parse_args_run_supernode().parse_args(command[1:])


def test_every_node_config_in_the_prose_parses_too() -> None:
    """Node configs shown inline in the text (not only in code blocks) are copied too."""
    text = DOC.read_text(encoding="utf-8")
    found = [re.sub(r"\s*\n\s*", " ", m.group(1)).replace('\\"', '"')
             for m in re.finditer(r'--node-config "((?:[^"\\]|\\.)*)"', text)]
    assert len(found) >= 3
    for config in found:
        check_node_config(config, f"docs/deployment.md: --node-config {config[:50]!r}")


def test_an_unquoted_string_in_a_node_config_is_what_the_doc_check_refuses() -> None:
    with pytest.raises(AssertionError, match="Flower refuses"):
        check_node_config('role=item-server data-dir="/data"', "example")


def test_the_superlink_command_keeps_state_and_parses_with_flowers_parser() -> None:
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink

    (link,) = [c for c in doc_commands("flower-superlink") if "--ssl-certfile" in c]
    args = _parse_args_run_superlink().parse_args(link[1:])
    assert args.database.endswith(".db") and args.enable_supernode_auth
    assert "in memory" in DOC.read_text(encoding="utf-8")


def test_the_connection_entry_comes_before_the_first_flwr_command_that_needs_it() -> None:
    text = DOC.read_text(encoding="utf-8")
    (entry,) = [b for b in code_blocks(text, "toml") if "[superlink.fedrec]" in b]
    assert tomllib.loads(entry)["superlink"]["default"] == "fedrec"
    first_use = min(m.start() for m in re.finditer(r"^ *```bash\n(.*?)^ *```", text,
                                                   flags=re.S | re.M)
                    if any(c[:2] in (["flwr", "supernode"], ["flwr", "run"])
                           for c in commands(m.group(1))))
    assert text.index("[superlink.fedrec]") < first_use


def test_the_first_submission_shown_is_the_one_whose_exit_code_is_the_runs_outcome() -> None:
    """``flwr run`` exits 0 for a failed run; the doc submits with ``deploy.run_status``,
    which exits 1 for it (``tests/test_deployment_failure.py``)."""
    text = DOC.read_text(encoding="utf-8")
    submits = [c for b in code_blocks(text, "bash") for c in commands(b)
               if c[:2] == ["flwr", "run"] or c[:4] == ["python", "-m", "deploy.run_status",
                                                        "--submit"]]
    assert submits[0][:3] == ["python", "-m", "deploy.run_status"], submits[0]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="make_certs.sh needs openssl")
def test_make_certs_refuses_to_replace_a_ca_without_force(tmp_path: Path) -> None:
    """Re-running section 1's command must not silently replace the CA every node trusts;
    ``--force`` (as the doc shows it) makes a new one."""
    import subprocess

    def make(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(REPO / "deploy" / "make_certs.sh"), *args],
                              capture_output=True, text=True, check=False)

    out = tmp_path / "certs"
    assert make(str(out)).returncode == 0
    first = {f: (out / f).read_bytes() for f in ("ca.crt", "ca.key", "server.key")}
    again = make(str(out), "DNS:superlink")
    assert again.returncode == 2 and "--force" in again.stderr, again.stderr
    assert {f: (out / f).read_bytes() for f in first} == first
    assert make("--force", str(out)).returncode == 0
    assert (out / "ca.key").read_bytes() != first["ca.key"]
    assert ["bash", "deploy/make_certs.sh", "--force", "deploy/certs"] in doc_commands("bash")
