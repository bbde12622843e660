"""Which data holder is SuperNode <id>? Node ids mapped to status, holder, partition and role.

``flwr supernode ls`` lists the SuperLink's node ids with their status (online, offline,
...) and owner only: the id is the SuperLink's, given when a SuperNode connects, and says
nothing about which holder's rows it serves. The ServerApp learns each node's partition and
role in the handshake and writes them to the run's results (``privacy.nodes``, node id ->
partition, role, identity source); the holder is the name its Flower authentication key was
registered under (``flwr supernode register <key>.pub <connection> --name <holder>``). This
command joins the two, and with ``--roster`` lists every partition of the federation, so a
holder with no node in that run shows up too.

It shows what the server already knows and nothing of a node's data: no counts of users
or items, no policy (the results file has the policies).

Usage::

    python -m deploy.node_status [<connection>] [--results FILE_OR_DIR] [--roster roster.json]
        [--format json]

``--results``: a run's results file, or a folder of them (the newest with ``privacy.nodes``
is used; default ``$FEDREC_RESULTS/runs``, else ``results/runs``). Exit 0; 2 if the
SuperLink cannot be asked or no results file maps any node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

OK, UNKNOWN = 0, 2
COLUMNS = ("node-id", "status", "holder", "partition", "role", "identity", "since")


def superlink_nodes(connection: str | None) -> list[dict[str, Any]]:
    """Every SuperNode the SuperLink knows, through the Control API call ``flwr supernode
    ls`` makes (flwr 1.42.0 ``cli/supernode/ls.py``), keeping the registered ``name`` that
    its output leaves out. Raises RuntimeError with Flower's message on failure."""
    import click
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import flwr_cli_exc_handler, init_http_client_from_connection
    from flwr.proto.control_pb2 import ListNodesRequest  # pylint: disable=E0611

    client = None
    try:
        # Flower prints "Using SuperLink: ..." on stdout: keep stdout for this command's output
        with contextlib.redirect_stdout(sys.stderr):
            conn = read_superlink_connection(connection)
            client = init_http_client_from_connection(conn)
            with flwr_cli_exc_handler():
                res = client.ListNodes(ListNodesRequest())
    except click.exceptions.Exit as exc:
        raise RuntimeError(f"no SuperLink connection {connection or '(default)'} "
                           f"(exit {exc.exit_code})") from None
    except click.ClickException as exc:
        raise RuntimeError(exc.format_message()) from None
    finally:
        if client is not None:
            client.close()
    return [{"node-id": int(n.node_id), "status": n.status,
             "name": n.name if n.HasField("name") else "", "owner": n.owner_name,
             "online-at": n.last_activated_at if n.HasField("last_activated_at") else "",
             "offline-at": n.last_deactivated_at if n.HasField("last_deactivated_at") else ""}
            for n in res.nodes_info]


def latest_record(path: Path, node_ids: Collection[int] = ()) -> tuple[Path, dict[str, Any]]:
    """The results record at ``path``, or the newest one in the folder ``path`` that maps
    nodes (``privacy.nodes``) and, given the SuperLink's ``node_ids``, maps one of them: a
    folder that also holds local simulations' results (their node ids are the simulation's
    own) then gives the federation's newest run, not the newest simulation."""
    files = ([path] if path.is_file() else
             sorted(path.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True))
    others = 0
    for file in files:
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        mapped = record.get("privacy", {}).get("nodes") if isinstance(record, dict) else None
        if not mapped:
            continue
        if not node_ids or {int(k) for k in mapped} & set(node_ids):
            return file, record
        others += 1
    if others:
        raise FileNotFoundError(
            f"{path}: none of the {others} results file(s) with 'privacy.nodes' maps a node "
            f"the SuperLink lists (local simulations' results do not); give --results the "
            "folder the ServerApp writes to ($FEDREC_RESULTS/runs on the SuperLink's machine)")
    raise FileNotFoundError(f"{path}: no results file with 'privacy.nodes' (a run's "
                            "handshake writes it)")


def node_rows(nodes: Sequence[Mapping[str, Any]], record: Mapping[str, Any] | None,
              roster_roles: Mapping[int, str] | None = None) -> list[dict[str, Any]]:
    """One row per node id (the SuperLink's nodes, then those only the run saw), then one
    per roster partition no node id holds; sorted by partition, item servers last.

    ``status`` is the SuperLink's, ``unknown`` for a node it no longer lists; a node that
    joined after the run has no partition (``-``)."""
    mapped = {int(k): v for k, v in ((record or {}).get("privacy", {})
                                     .get("nodes", {}).items())}
    rows: dict[int, dict[str, Any]] = {}
    for node in nodes:
        since = node["offline-at"] if node["status"] == "offline" else node["online-at"]
        rows[int(node["node-id"])] = {"node-id": int(node["node-id"]), "status": node["status"],
                                      "holder": node["name"] or "-", "since": since or "-"}
    for node_id in mapped:
        rows.setdefault(node_id, {"node-id": node_id, "status": "unknown", "holder": "-",
                                  "since": "-"})
    for node_id, row in rows.items():
        info = mapped.get(node_id, {})
        row.update(partition=info.get("partition", "-"), role=info.get("role", "-"),
                   identity=info.get("identity") or "-")
    out = list(rows.values())
    held = {row["partition"] for row in out}
    out += [{"node-id": "-", "status": "no node in the run", "holder": "-",
             "partition": partition, "role": role, "identity": "roster", "since": "-"}
            for partition, role in sorted((roster_roles or {}).items()) if partition not in held]

    def order(row: Mapping[str, Any]) -> tuple[int, int, str]:
        p = row["partition"]
        return ((0, p, "") if isinstance(p, int) and p >= 0 else
                (1, -p, "") if isinstance(p, int) else (2, 0, str(row["node-id"])))
    return sorted(out, key=order)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Plain aligned columns (:data:`COLUMNS`)."""
    cells = [list(COLUMNS)] + [[str(r[c]) for c in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip()
                     for line in cells)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.node_status",
        description="Map the SuperLink's node ids to status, holder (registered name), "
                    "partition and role (from a run's results).")
    parser.add_argument("connection", nargs="?", default=None,
                        help="SuperLink connection (default: the flwr config's default)")
    default_results = Path(os.environ.get("FEDREC_RESULTS", "results")) / "runs"
    parser.add_argument("--results", type=Path, default=default_results,
                        help="a run's results file or a folder of them (newest used; "
                             f"default {default_results})")
    parser.add_argument("--roster", type=Path, default=None,
                        help="the federation's roster.json: also list partitions no node "
                             "held in that run")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)

    roster_roles = None
    if args.roster is not None:
        from fedrec.secure.identity import IdentityError, Roster

        try:
            roster = Roster.load(args.roster)
        except IdentityError as exc:
            parser.error(str(exc))
        roster_roles = {p: roster.roles.get(p, "-") for p in roster.keys}
    try:
        nodes = superlink_nodes(args.connection)
    except RuntimeError as exc:
        print(f"node_status: cannot ask the SuperLink: {exc}", file=sys.stderr)
        return UNKNOWN
    try:
        source, record = latest_record(args.results, [int(n["node-id"]) for n in nodes])
    except FileNotFoundError as exc:
        print(f"node_status: {exc}", file=sys.stderr)
        return UNKNOWN
    rows = node_rows(nodes, record, roster_roles)
    run = record.get("config", {}).get("run-name") or source.stem  # "" names by default
    if args.format == "json":
        print(json.dumps({"results": str(source), "run-name": run, "nodes": rows}))
    else:
        print(f"partitions and roles from run {run!r} ({source})")
        print(table(rows))
    return OK


if __name__ == "__main__":
    sys.exit(main())
