"""Round floor: wall time of one empty request/reply round over the Flower Grid.

One Flower simulation (Ray backend, ``client_resources`` num_cpus=1) with ``max(--nodes)``
SuperNodes; its ServerApp measures, for each node count N (the first N node ids), the median
wall time of a round that sends a tiny request to N nodes running an echo handler and waits
for all N replies, with

(a) our :class:`fedrec.transport.messenger.Messenger` (``push_messages`` + ``pull_messages`` with a
    2 ms poll, backing off to 250 ms within a round), and
(b) Flower's own ``Grid.send_and_receive`` on the same grid (0.1 s poll in simulation),

``--rounds`` timed rounds each after ``--warmup`` warm-up rounds.

Then the deployed round: a tiny FedMF run (``--deployed-rounds`` train + evaluate rounds) on a
real TLS SuperLink and ``--deployed-nodes`` SuperNodes on this machine, started with
``deploy/local_deployment.py`` (its default settings; ``--deployed-flower-defaults`` measures
Flower's own settings as well), timed from the run's phase ledger, with the CPU seconds
each kind of Flower process used (sampled from ``/proc``). Writes ``results/messaging.json``
(``deployed_round_s`` and its breakdown) and ``results/messaging.md``.

Run: ``python benchmarks/messaging.py [--nodes 10 100] [--rounds 30] [--warmup 3]
[--deployed-rounds 3] [--deployed-flower-defaults] [--skip-deployed]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from benchmarks._report import machine_info, write_report  # noqa: E402
from clients.handlers import QUERY_HANDLERS, handler  # noqa: E402
from clients.node import NodeContext  # noqa: E402
from fedrec.transport.messenger import DEFAULT_POLL_INTERVAL, Messenger  # noqa: E402
from fl_app.simulation import simulate  # noqa: E402

ACTION = "bench_echo"
TARGETS_MS = {10: 120.0, 100: 400.0}
DEPLOYED_TARGET_S = 5.0
#: Hard-coded in flwr 1.42.0 ``supernode/start_client_internal.py`` (no flag): an idle SuperNode
#: sleeps this long after an empty pull, and checks for its ClientApp's reply in these steps.
SUPERNODE_IDLE_SLEEP_S = 3.0
SUPERNODE_REPLY_CHECK_S = 0.5
#: flwr 1.42.0's default ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``.
SUPEREXEC_DEFAULT_POLL_S = 1.0
PROCESS_KINDS = ("flwr-clientapp", "flwr-serverapp", "flower-superexec", "flower-supernode",
                 "flower-superlink")


def bench_echo(content: RecordDict, node: NodeContext) -> RecordDict:
    """Reply with the (tiny) request."""
    return content


if ACTION not in QUERY_HANDLERS:  # idempotent when imported twice (__main__ and module)
    handler(ACTION)(bench_echo)


def _tiny(i: int) -> RecordDict:
    return RecordDict({"c": ConfigRecord({"i": i})})


def _stats(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in samples)
    return {"median": statistics.median(ms), "min": ms[0], "max": ms[-1],
            "p90": ms[min(len(ms) - 1, int(0.9 * len(ms)))]}


def messenger_round(messenger: Messenger, nodes: list[int], i: int) -> dict[str, float]:
    """One Messenger round; seconds to the first and the last reply."""
    t0 = time.perf_counter()
    first = None
    n = 0
    for _node, _reply in messenger.iter_replies(ACTION, {nd: _tiny(i) for nd in nodes},
                                                 phase=f"bench-{len(nodes)}"):
        n += 1
        if first is None:
            first = time.perf_counter() - t0
    assert n == len(nodes)
    return {"total": time.perf_counter() - t0, "first": first or 0.0}


def flower_round(grid: Grid, nodes: list[int], i: int) -> float:
    """One round through Flower's ``Grid.send_and_receive``."""
    msgs = [Message(_tiny(i), dst_node_id=nd, message_type=f"query.{ACTION}", group_id=str(i))
            for nd in nodes]
    t0 = time.perf_counter()
    replies = list(grid.send_and_receive(msgs, timeout=120))
    dt = time.perf_counter() - t0
    if len(replies) != len(nodes) or any(r.has_error() for r in replies):
        raise RuntimeError(f"send_and_receive: {len(replies)} of {len(nodes)} replies")
    return dt


def measure(grid: Grid, sizes: list[int], rounds: int, warmup: int) -> dict[str, Any]:
    messenger = Messenger(grid, timeout=120)
    all_ids = messenger.node_ids(max(sizes), wait=120)
    out: dict[str, Any] = {}
    for n in sizes:
        nodes = all_ids[:n]
        for i in range(warmup):
            messenger_round(messenger, nodes, i)
        ours = [messenger_round(messenger, nodes, i) for i in range(rounds)]
        for i in range(warmup):
            flower_round(grid, nodes, i)
        theirs = [flower_round(grid, nodes, i) for i in range(rounds)]
        out[str(n)] = {
            "messenger": _stats([r["total"] for r in ours]),
            "messenger_first_reply": _stats([r["first"] for r in ours]),
            "send_and_receive": _stats(theirs),
        }
        print(f"{n:>4} nodes: Messenger {out[str(n)]['messenger']['median']:7.1f} ms "
              f"(first reply {out[str(n)]['messenger_first_reply']['median']:.1f} ms), "
              f"send_and_receive {out[str(n)]['send_and_receive']['median']:7.1f} ms",
              flush=True)
    return out


def run(sizes: list[int], rounds: int, warmup: int) -> dict[str, Any]:

    from fl_app.client_app import build_client_app  # after our handler is registered

    box: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        box["result"] = measure(grid, sizes, rounds, warmup)

    t0 = time.perf_counter()
    simulate(server_app, build_client_app(), max(sizes),
             {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
              "init_args": {"include_dashboard": False}})
    if "result" not in box:
        raise RuntimeError("the benchmark ServerApp did not finish (see the log above)")
    box["simulation_seconds"] = time.perf_counter() - t0
    return box


# ----------------------------------------------------------------------------- deployed
class _CpuSampler:
    """CPU seconds and lifetimes of the deployment's processes, sampled from ``/proc``.

    A process's CPU is read while it lives (every ``interval`` s), so short-lived
    ``flwr-clientapp`` processes are caught unless they live less than ``interval``.
    """

    def __init__(self, roots: Callable[[], list[int]], interval: float = 0.05) -> None:
        self.roots, self.interval = roots, interval
        self.cpu: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self.seen: dict[int, list[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _kind(self, pid: int) -> str:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3]
        except OSError:
            return "other"
        names = " ".join(os.path.basename(a.decode(errors="replace")) for a in argv)
        return next((k for k in PROCESS_KINDS if k in names), "other")

    def _run(self) -> None:
        from deploy.local_deployment import descendants

        while not self._stop.is_set():
            now = time.monotonic()
            for root in self.roots():
                for pid in (root, *descendants(root)):
                    try:
                        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    except (OSError, IndexError):
                        continue
                    self.cpu[pid] = (int(stat[11]) + int(stat[12])) / self._tick
                    self.kind.setdefault(pid, self._kind(pid))
                    self.seen.setdefault(pid, [now, now])[1] = now
            self._stop.wait(self.interval)

    def __enter__(self) -> _CpuSampler:
        if os.path.isdir("/proc"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def summary(self) -> dict[str, Any]:
        cpu: dict[str, float] = {}
        count: dict[str, int] = {}
        for pid, sec in self.cpu.items():
            cpu[self.kind[pid]] = cpu.get(self.kind[pid], 0.0) + sec
            count[self.kind[pid]] = count.get(self.kind[pid], 0) + 1
        life = [b - a for pid, (a, b) in self.seen.items() if self.kind[pid] == "flwr-clientapp"]
        return {"cpu_s": cpu, "processes": count,
                "clientapp_lifetime_s": statistics.median(life) if life else None}


def measure_imports(repeats: int = 3) -> dict[str, float]:
    """Median seconds to import Flower's ClientApp entry point, and this app on top of it."""
    import subprocess

    code = ("import time; t0 = time.perf_counter(); import flwr.supernode.cli.flwr_clientapp; "
            "t1 = time.perf_counter(); import fl_app.client_app; t2 = time.perf_counter(); "
            "print(t1 - t0, t2 - t1)")
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, cwd=str(ROOT),
                             env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
        runs.append((float(out[0]), float(out[1])))
    return {"flwr_clientapp": statistics.median(r[0] for r in runs),
            "app": statistics.median(r[1] for r in runs)}


def measure_deployed(nodes: int, rounds: int, flower_defaults: bool) -> dict[str, Any]:
    """Seconds per message round of a tiny FedMF run on a local TLS deployment."""
    from deploy.local_deployment import (
        NODE_FAST_ENV,
        LocalDeployment,
        message_round_seconds,
    )

    cfg = {"protocol": "fedmf", "dataset": "synthetic", "synthetic-users": 60,
           "synthetic-items": 80, "mf-dim": 4, "rounds": rounds,
           "run-name": f"bench-deployed{'-defaults' if flower_defaults else ''}"}
    with LocalDeployment(nodes, flower_defaults=flower_defaults) as dep:
        roots = lambda: [p.popen.pid for p in (dep.superlink, *dep.nodes) if p is not None]  # noqa: E731
        with _CpuSampler(roots) as sampler:
            record = dep.run(cfg, timeout=900)
    phases = record["communication"]["phases"]
    msg_rounds = sum(st["rounds"] for name, st in phases.items() if name != "handshake")
    usage = sampler.summary()
    poll = (SUPEREXEC_DEFAULT_POLL_S if flower_defaults
            else float(NODE_FAST_ENV["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"]))
    return {
        "round_s": message_round_seconds(record),
        "handshake_s": phases.get("handshake", {}).get("seconds"),
        "phase_round_s": {n: st["seconds"] / max(st["rounds"], 1) for n, st in phases.items()},
        "message_rounds": msg_rounds,
        "wall_s": record["deployment"]["wall_seconds"],
        "nodes": nodes, "tls": record["deployment"]["tls"], "fedmf_rounds": rounds,
        "superexec_poll_s": poll,
        "settings": "Flower defaults" if flower_defaults else "deploy/local_deployment.py",
        "clientapp_lifetime_s": usage["clientapp_lifetime_s"],
        "cpu_s": usage["cpu_s"],
        "cpu_s_per_round": {k: v / max(msg_rounds + 1, 1) for k, v in usage["cpu_s"].items()},
        "processes": usage["processes"],
        "metrics": record["metrics"],
    }


def _deployed_markdown(result: dict[str, Any]) -> str:
    dep = result.get("deployed")
    if not dep:
        return "No deployed measurement in this run (`--skip-deployed`).\n"
    sim10 = result["round_ms"].get("10")
    cores = result["cpus"] or 1
    rows = [dep, *([result["deployed_flower_defaults"]]
                   if result.get("deployed_flower_defaults") else [])]
    table = "\n".join(
        f"| {d['settings']} | {d['superexec_poll_s']:g} | {d['round_s']:.2f} | "
        f"{d['handshake_s']:.1f} | "
        f"{d['clientapp_lifetime_s'] if d['clientapp_lifetime_s'] is None else round(d['clientapp_lifetime_s'], 2)} | "
        f"{sum(d['cpu_s_per_round'].values()):.1f} | "
        f"{d['cpu_s_per_round'].get('flwr-clientapp', 0.0):.1f} | "
        f"{'yes' if d['round_s'] <= DEPLOYED_TARGET_S else 'NO'} |" for d in rows)
    cpu_round = sum(dep["cpu_s_per_round"].values())
    app_cpu = dep["cpu_s_per_round"].get("flwr-clientapp", 0.0)
    infra_cpu = cpu_round - app_cpu
    fixed = SUPERNODE_IDLE_SLEEP_S + dep["superexec_poll_s"] / 2 + SUPERNODE_REPLY_CHECK_S / 2
    lines = [
        f"One deployed message round (FedMF train/evaluate on tiny data, {dep['nodes']} "
        f"SuperNodes, TLS {'on' if dep['tls'] else 'off'}, same machine; mean over "
        f"{dep['message_rounds']} rounds after the handshake) took **{dep['round_s']:.2f} s**",
    ]
    if sim10:
        lines.append(f"against {sim10:.0f} ms for a 10-node simulated round above, "
                     f"{dep['round_s'] * 1e3 / sim10:.0f}x as long")
    verdict = (f"meets the {DEPLOYED_TARGET_S:g} s target" if dep["round_s"] <= DEPLOYED_TARGET_S
               else f"misses the {DEPLOYED_TARGET_S:g} s target by "
                    f"{dep['round_s'] - DEPLOYED_TARGET_S:.1f} s")
    text = ", ".join(lines) + f"; it {verdict}.\n\n"
    text += f"""| settings | SuperExec poll (s) | s per message round | handshake round (s) | ClientApp process lifetime, median (s) | CPU s per round, all processes | CPU s per round, ClientApps | target met |
|---|---:|---:|---:|---:|---:|---:|:---:|
{table}

**Where the deployed round goes.** Waits that do not need CPU add up to about {fixed:.2f} s:
the SuperNode's hard-coded {SUPERNODE_IDLE_SLEEP_S:g} s sleep after an empty pull (the node
that answered last pulls again at once, finds nothing because the server has not pushed the
next request yet, and sleeps the full {SUPERNODE_IDLE_SLEEP_S:g} s), half the SuperExec's
{dep['superexec_poll_s']:g} s task poll, and half the {SUPERNODE_REPLY_CHECK_S:g} s step in
which the SuperNode checks for its ClientApp's reply. The rest of the
{dep['round_s']:.2f} s ({max(dep['round_s'] - fixed, 0.0):.2f} s) is the new
`flwr-clientapp` process each node starts per message (median lifetime
{'n/a' if dep['clientapp_lifetime_s'] is None else f"{dep['clientapp_lifetime_s']:.2f} s"}),
and it is CPU: the processes used {cpu_round:.1f} CPU-seconds per message round
({app_cpu:.1f} in ClientApp processes, and {infra_cpu:.1f} in the SuperLink, SuperNodes,
SuperExecs and ServerApp), against {cores} cores, i.e. at least
{cpu_round / cores:.2f} s of wall time per round if this benchmark had the machine to itself"""
    if cpu_round / cores > dep["round_s"] - fixed:
        text += (f", which is more than the {max(dep['round_s'] - fixed, 0.0):.2f} s left after "
                 "the waits: the processes ran in parallel with the waits or on cores other "
                 "jobs left free")
    else:
        text += (f"; the {dep['round_s'] - fixed - cpu_round / cores:.2f} s beyond that is "
                 "time the processes waited for a core (other load on the machine)")
    text += ".\n"
    imp = dep.get("import_s") or {}
    if imp:
        share = imp["flwr_clientapp"] / max(imp["flwr_clientapp"] + imp["app"], 1e-9)
        text += (f"\nEach ClientApp process first imports Flower's `flwr-clientapp` entry point "
                 f"({imp['flwr_clientapp']:.2f} s measured alone on this machine) and then this "
                 f"app's `fl_app.client_app` ({imp['app']:.2f} s on top): Flower's own imports "
                 f"are {share:.0%} of that, and only a change in Flower (a ClientApp process "
                 "that outlives one message) removes them.\n")
    if result.get("deployed_flower_defaults"):
        base = result["deployed_flower_defaults"]
        diff = base["round_s"] - dep["round_s"]
        text += (f"\nWith Flower's defaults the round took {base['round_s']:.2f} s: the launcher's "
                 f"settings {'saved' if diff > 0 else 'cost'} {abs(diff):.2f} s per round "
                 f"(the SuperExec poll alone accounts for about "
                 f"{(base['superexec_poll_s'] - dep['superexec_poll_s']) / 2:.2f} s on average).\n")
    return text


def _simulated_comparison(result: dict[str, Any]) -> str:
    """What the simulated numbers show, sentence by sentence, from the numbers."""
    out = []
    for n, det in result["detail"].items():
        ours, theirs = det["messenger"]["median"], det["send_and_receive"]["median"]
        floor = ours - 100.0
        rel = "above" if floor >= 0 else "below"
        diff = theirs - ours
        if abs(diff) < 0.05 * max(ours, theirs):
            cmp = f"within 5 % of `send_and_receive` ({theirs:.0f} ms)"
        elif diff > 0:
            cmp = f"{diff:.0f} ms faster than `send_and_receive` ({theirs:.0f} ms)"
        else:
            cmp = f"{-diff:.0f} ms slower than `send_and_receive` ({theirs:.0f} ms)"
        out.append(f"At {n} nodes the Messenger round took {ours:.0f} ms, {abs(floor):.0f} ms "
                   f"{rel} the engine's 100 ms cycle and {cmp}.")
    return " ".join(out)


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for n, det in result["detail"].items():
        target = TARGETS_MS.get(int(n))
        ours = det["messenger"]["median"]
        rows.append(
            f"| {n} | {ours:.1f} | {det['messenger']['p90']:.1f} | "
            f"{det['messenger_first_reply']['median']:.1f} | "
            f"{det['send_and_receive']['median']:.1f} | "
            f"{'%.0f' % target if target else '-'} | "
            f"{'yes' if target is None or ours <= target else 'NO'} |"
        )
    text = f"""# Messaging round floor

Median wall time of one empty request/reply round (echo handler, tiny payload) in a Flower
{result['flwr_version']} simulation (Ray backend, `num_cpus=1` per ClientApp, {result['cpus']}
CPU cores), {result['rounds']} timed rounds after {result['warmup']} warm-up rounds, one
simulation of {result['simulation_nodes']} SuperNodes (the N-node rows address the first N).
Produced by `python benchmarks/messaging.py`.

| nodes | Messenger median (ms) | Messenger p90 (ms) | first reply (ms) | `Grid.send_and_receive` median (ms) | target (ms) | met |
|---:|---:|---:|---:|---:|---:|:---:|
{chr(10).join(rows)}

**Where the floor comes from.** Flower moves messages by polling. In simulation, the thread
that feeds the ClientApp workers (`add_messages_to_queue` in
`flwr/server/superlink/fleet/vce/vce_api.py`) takes at most one message per node from the
link state and then waits 0.1 s, so a synchronous round cannot finish much faster than
100 ms however quickly the server polls; with many nodes the ClientApp calls themselves (Ray
workers on {result['cpus']} cores, each call deserialising the message and the node's
context) add to that. `Messenger` pushes all requests at once and pulls replies with a
{DEFAULT_POLL_INTERVAL * 1e3:g} ms poll for the first 0.2 s of a round, then 20 ms (`Messenger.poll_wait`); `Grid.send_and_receive` sleeps 0.1 s between pulls.
{_simulated_comparison(result)} Targets: <= 120 ms at 10 nodes, <= 400 ms at 100 nodes.

{result['notes']}

## Deployed round

{_deployed_markdown(result)}"""
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "messaging.json")
    parser.add_argument("--deployed-nodes", type=int, default=3)
    parser.add_argument("--deployed-rounds", type=int, default=3,
                        help="FedMF rounds of the deployed run (2 message rounds each)")
    parser.add_argument("--deployed-flower-defaults", action="store_true",
                        help="also measure a deployment with Flower's default settings")
    parser.add_argument("--skip-deployed", action="store_true")
    args = parser.parse_args(argv)
    sizes = sorted(set(args.nodes))
    box = run(sizes, args.rounds, args.warmup)
    deployed = deployed_defaults = None
    if not args.skip_deployed:
        deployed = measure_deployed(args.deployed_nodes, args.deployed_rounds, False)
        deployed["import_s"] = measure_imports()
        print(f"deployed: {deployed['round_s']:.2f} s per message round", flush=True)
        if args.deployed_flower_defaults:
            deployed_defaults = measure_deployed(args.deployed_nodes, args.deployed_rounds, True)
            print(f"deployed, Flower defaults: {deployed_defaults['round_s']:.2f} s per "
                  "message round", flush=True)
    detail = box["result"]
    misses = [n for n in sizes if n in TARGETS_MS
              and detail[str(n)]["messenger"]["median"] > TARGETS_MS[n]]
    notes = (
        "Messenger: push_messages + pull_messages with a "
        f"{DEFAULT_POLL_INTERVAL * 1e3:g} ms poll (20 ms after 0.2 s, 50 ms after 1 s, 250 ms "
        "after 3 s: Messenger.poll_wait); send_and_receive: Flower's InMemoryGrid "
        "method (0.1 s pull interval). Same simulation, same nodes, same echo handler. "
        "'first reply' is the median time from push to the first reply of a Messenger round."
        + (f" Targets missed at {misses} nodes." if misses else " All targets met.")
    )
    result = {
        "round_ms": {n: detail[n]["messenger"]["median"] for n in detail},
        "send_and_receive_round_ms": {n: detail[n]["send_and_receive"]["median"]
                                      for n in detail},
        "rounds": args.rounds,
        "warmup": args.warmup,
        **machine_info(),
        "simulation_nodes": max(sizes),
        "simulation_seconds": round(box["simulation_seconds"], 1),
        "targets_ms": {str(k): v for k, v in TARGETS_MS.items()},
        "detail": detail,
        "notes": notes,
        "deployed_round_s": deployed["round_s"] if deployed else None,
        "deployed_target_s": DEPLOYED_TARGET_S,
        "deployed": deployed,
        "deployed_flower_defaults": deployed_defaults,
    }
    write_report(args.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
