"""Cost of a secure sum (SecAgg+, the run's automatic graph) vs a plain sum over Flower messages.

One Flower simulation (Ray backend, ``num_cpus=1`` per ClientApp) per node count; inside it
the ServerApp measures, for every vector length, ``--repeats`` sums of each mode (plain and
secure interleaved) with the ``diag_secure_sum`` handler (one array "v" of the given length,
standard normal values, ``max_abs=10``) and records the median wall time of one sum and its
bytes (requests + replies of the sum round, plus the unmask round for SecAgg+, from the
Messenger's ledger). Key setup (``secagg_advertise``, which also opens the sealed relay, +
``secagg_share``, one batch of self-mask seeds covering every sum of the simulation) runs once
per simulation and is reported separately (``setup_seconds``, ``setup_bytes``,
``setup_rounds``), not in the per-sum time.
Every secure sum is checked against the plain sum of the same inputs.

``--profile`` adds, for the largest vector at the smallest node count, one profiled sum of
each mode: cProfile of the server's ``sum`` call, and the node-side handler time (a wrapper
handler that runs ``diag_secure_sum`` under cProfile and returns its top entries).

Writes ``results/secure.json`` and ``results/secure.md``.

Run: ``python benchmarks/secure.py [--nodes 10 50] [--floats 1000 100000 1000000]
[--repeats 3] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from benchmarks._report import machine_info, write_report  # noqa: E402
from clients.diagnostics import diag_secure_sum  # noqa: E402
from clients.handlers import QUERY_HANDLERS, handler  # noqa: E402
from clients.node import NodeContext  # noqa: E402
from fedrec.secure.fixedpoint import FixedPoint  # noqa: E402
from fedrec.transport.aggregators import Aggregator, PlainAggregator  # noqa: E402
from fedrec.transport.factory import auto_degree  # noqa: E402
from fedrec.transport.messenger import Messenger  # noqa: E402
from fedrec.transport.secagg_server import SecureAggregator  # noqa: E402
from fedrec.wire.diagnostics import DIAG, Action  # noqa: E402
from fedrec.wire.mail import Action as MailAction  # noqa: E402
from fl_app.simulation import simulate  # noqa: E402

ACTION = Action.SECURE_SUM
TIMED_ACTION = "bench_secure_sum_timed"
MAX_ABS = 10.0
SEED = 7
TARGET_RATIO = 5.0  # SecAgg+ at 1e6 floats, 10 nodes: < 5x the plain sum


def _top(profile: cProfile.Profile, n: int = 12) -> list[str]:
    """The ``n`` entries with the largest own time, one line each."""
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    out = []
    for (file, line, name), (_cc, ncalls, tottime, cumtime, _) in rows:
        short = "/".join(Path(file).parts[-2:])
        out.append(f"{tottime:8.3f}s own {cumtime:8.3f}s cum {ncalls:6d}x {short}:{line} {name}")
    return out


def bench_secure_sum_timed(content: RecordDict, node: NodeContext) -> RecordDict:
    """``diag_secure_sum`` under cProfile; the reply carries the handler time and top entries."""
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    reply = diag_secure_sum(content, node)
    prof.disable()
    seconds = time.perf_counter() - t0
    reply["bench-timing"] = ConfigRecord({"seconds": seconds, "top": _top(prof, 10)})
    return reply


if TIMED_ACTION not in QUERY_HANDLERS:  # idempotent when imported twice (__main__ and module)
    handler(TIMED_ACTION)(bench_secure_sum_timed)


class MemoryWatch:
    """Peak machine-wide memory in use (MemTotal - MemAvailable), sampled every 0.2 s."""

    def __init__(self) -> None:
        self.base = self._used()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _used() -> int:
        info = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024
        return info["MemTotal"] - info["MemAvailable"]

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def _request(floats: int) -> RecordDict:
    return RecordDict({DIAG: ConfigRecord({"seed": SEED, "v": [int(floats)]})})


def _phase_cost(messenger: Messenger, phase: str) -> tuple[int, float]:
    """(bytes up + down, seconds) of ``phase`` and its unmask round, if any."""
    total_bytes, seconds = 0, 0.0
    for name in (phase, f"{phase}:confirm", f"{phase}:unmask"):
        if name in messenger.ledger.phases:
            st = messenger.ledger.phases[name]
            total_bytes += st.bytes_up + st.bytes_down
            seconds += st.seconds
    return total_bytes, seconds


def _one_sum(agg: Aggregator, messenger: Messenger, floats: int,
             phase: str) -> tuple[float, int, np.ndarray, dict[str, float]]:
    t0 = time.perf_counter()
    out = agg.sum(ACTION, _request(floats), max_abs=MAX_ABS, phase=phase)
    seconds = time.perf_counter() - t0
    nbytes, _ = _phase_cost(messenger, phase)
    rounds = {"masked_round_seconds": messenger.ledger.phases[phase].seconds}
    for step in ("confirm", "unmask"):
        if f"{phase}:{step}" in messenger.ledger.phases:
            rounds[f"{step}_round_seconds"] = messenger.ledger.phases[f"{phase}:{step}"].seconds
    return seconds, nbytes, out["v"], rounds


def measure(messenger: Messenger, num_nodes: int, floats_list: list[int], repeats: int,
            profile: bool) -> dict[str, Any]:
    nodes = messenger.node_ids(min_nodes=num_nodes)[:num_nodes]
    degree = auto_degree(len(nodes))
    secure = SecureAggregator(messenger, nodes, seed=SEED, degree=degree,
                              seed_batch=len(floats_list) * repeats + 6, allow_dropouts=True)
    plain = PlainAggregator(messenger, nodes)
    # warm-up (Ray workers start, import and load on their first calls), before key setup
    # so that the setup time is the protocol's, not the workers' cold start
    for i in range(2):
        _one_sum(plain, messenger, 1000, f"warmup-plain-{i}")
    t0 = time.perf_counter()
    secure.setup()
    setup_seconds = time.perf_counter() - t0
    setup_phases = [messenger.ledger.phases[p] for p in (MailAction.RELAY_KEYS, "secagg_setup")
                    if p in messenger.ledger.phases]
    setup_bytes = sum(st.bytes_up + st.bytes_down for st in setup_phases)
    setup_rounds = sum(st.rounds for st in setup_phases)
    _one_sum(secure, messenger, 1000, "warmup-secure")
    codec = FixedPoint.for_sum(MAX_ABS, num_nodes)
    runs = []
    for floats in floats_list:
        samples: dict[str, list] = {"plain": [], "secagg": []}
        detail: list[dict[str, float]] = []
        max_err = 0.0
        for rep in range(repeats):
            p_sec, p_bytes, p_sum, _ = _one_sum(plain, messenger, floats, f"plain:{floats}:{rep}")
            s_sec, s_bytes, s_sum, rounds = _one_sum(secure, messenger, floats,
                                                     f"secagg:{floats}:{rep}")
            samples["plain"].append((p_sec, p_bytes))
            samples["secagg"].append((s_sec, s_bytes))
            detail.append(rounds)
            max_err = max(max_err, float(np.max(np.abs(s_sum - p_sum))))
            del p_sum, s_sum
        tol = num_nodes * codec.resolution + 1e-9
        if max_err > tol:
            raise AssertionError(f"secure sum differs from plain sum by {max_err} > {tol}")
        plain_s = statistics.median(s for s, _ in samples["plain"])
        secure_s = statistics.median(s for s, _ in samples["secagg"])
        run = {
            "floats": floats, "nodes": num_nodes, "degree": degree or num_nodes - 1,
            "secagg_seconds": round(secure_s, 4), "plain_seconds": round(plain_s, 4),
            "secagg_bytes": int(statistics.median(b for _, b in samples["secagg"])),
            "plain_bytes": int(statistics.median(b for _, b in samples["plain"])),
            "setup_seconds": round(setup_seconds, 4),
            "ratio": round(secure_s / plain_s, 3),
            "setup_bytes": setup_bytes,
            "setup_rounds": setup_rounds,
            "secagg_samples": [round(s, 4) for s, _ in samples["secagg"]],
            "plain_samples": [round(s, 4) for s, _ in samples["plain"]],
            "secagg_masked_round_seconds": round(statistics.median(
                d["masked_round_seconds"] for d in detail), 4),
            "secagg_unmask_round_seconds": round(statistics.median(
                d["unmask_round_seconds"] for d in detail), 4),
            "max_abs_diff_vs_plain": max_err,
        }
        runs.append(run)
        print(f"[{num_nodes} nodes, {floats:>9,} floats] secagg {secure_s:7.3f} s "
              f"(masked round {run['secagg_masked_round_seconds']:.3f}, unmask "
              f"{run['secagg_unmask_round_seconds']:.3f}), plain {plain_s:7.3f} s, "
              f"ratio {run['ratio']:.2f}, bytes {run['secagg_bytes']:,} vs "
              f"{run['plain_bytes']:,}, setup {setup_seconds:.2f} s", flush=True)
    out: dict[str, Any] = {"runs": runs,
                           "dropout": measure_dropout(messenger, secure, plain, max(floats_list),
                                                      runs[-1])}
    if profile:
        out["profile"] = profile_sums(messenger, secure, plain, max(floats_list))
    return out


def measure_dropout(messenger: Messenger, secure: SecureAggregator, plain: PlainAggregator,
                    floats: int, clean: dict[str, Any]) -> dict[str, Any]:
    """One sum of ``floats`` values in which one node's masked input is lost (the server's
    ``drop`` knob), with every node allowing dropouts: the consistency round (survivors sign
    the survivor and dropped lists) and the dropped node's pairwise keys come on top of the
    sum without dropouts (``clean``). Checked: plain sum minus the SecAgg+ sum is one node's
    input. The node stays out of every later sum (the last measurement of the simulation)."""
    _, _, full, _ = _one_sum(plain, messenger, floats, "plain:dropout")
    secure.drop = {secure.nodes[-1]}
    seconds, nbytes, got, rounds = _one_sum(secure, messenger, floats, "secagg-dropout")
    secure.drop = set()
    from clients.diagnostics import diagnostic_vector

    missing = full - got
    tol = len(secure.nodes) * FixedPoint.for_sum(MAX_ABS, len(secure.nodes)).resolution + 1e-9
    if not any(np.max(np.abs(missing - diagnostic_vector(SEED, p, (floats,)))) <= tol
               for p in range(len(secure.nodes))):
        raise AssertionError("the SecAgg+ sum with a dropout is not the plain sum less one node")
    out = {"floats": floats, "nodes": len(secure.nodes), "seconds": round(seconds, 4),
           "bytes": nbytes,
           "confirm_round_seconds": round(rounds.get("confirm_round_seconds", 0.0), 4),
           "unmask_round_seconds": round(rounds.get("unmask_round_seconds", 0.0), 4),
           "over_clean_sum": round(seconds / clean["secagg_seconds"], 3),
           "over_plain_sum": round(seconds / clean["plain_seconds"], 3)}
    print(f"[{out['nodes']} nodes, {floats:>9,} floats, one dropout] secagg {seconds:7.3f} s "
          f"(consistency round {out['confirm_round_seconds']:.3f} s), "
          f"{out['over_clean_sum']:.2f}x the sum without dropouts", flush=True)
    return out


def profile_sums(messenger: Messenger, secure: SecureAggregator, plain: PlainAggregator,
                 floats: int) -> dict[str, Any]:
    """One profiled sum per mode: server cProfile, node-side handler time and top entries."""
    out: dict[str, Any] = {"floats": floats, "nodes": len(secure.nodes)}
    for name, agg in (("plain", plain), ("secagg", secure)):
        node_times: dict[int, float] = {}
        node_top: dict[int, list[str]] = {}

        def keep(node: int, reply: RecordDict) -> None:
            timing = reply.config_records["bench-timing"]
            node_times[node] = float(timing["seconds"])
            node_top[node] = list(timing["top"])

        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        agg.sum(TIMED_ACTION, _request(floats), max_abs=MAX_ABS, phase=f"profile-{name}",
                on_reply=keep)
        prof.disable()
        wall = time.perf_counter() - t0
        times = list(node_times.values())
        out[name] = {
            "wall_seconds": round(wall, 4),
            "server_top": _top(prof, 15),
            "node_handler_seconds": {str(k): round(v, 4) for k, v in node_times.items()},
            "node_handler_seconds_median": round(statistics.median(times), 4),
            "node_handler_seconds_sum": round(sum(times), 4),
            "node_top_example": node_top[min(node_top)],
        }
    return out


def run_sim(num_nodes: int, floats_list: list[int], repeats: int, profile: bool) -> dict[str, Any]:

    from fl_app.client_app import build_client_app  # after our handler is registered

    box: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        messenger = Messenger(grid, timeout=900.0)
        try:
            box["result"] = measure(messenger, num_nodes, floats_list, repeats, profile)
        except BaseException as exc:  # report after Flower shuts down
            box["error"] = exc

    t0 = time.perf_counter()
    with MemoryWatch() as mem:
        # the diagnostic actions and plain sums (the baseline), opted in for this benchmark
        simulate(server_app,
                 build_client_app(["clients.diagnostics"],
                                  policy={"allow-plain": True, "allow-dropouts": True}),
                 num_nodes, {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                             "init_args": {"include_dashboard": False}})
    if "error" in box:
        raise box["error"]
    if "result" not in box:
        raise RuntimeError("the benchmark ServerApp did not finish (see the log above)")
    box["result"]["simulation_seconds"] = round(time.perf_counter() - t0, 2)
    box["result"]["peak_memory_gib"] = round(mem.peak / 2**30, 2)
    box["result"]["memory_increase_gib"] = round((mem.peak - mem.base) / 2**30, 2)
    return box["result"]


#: Targets at 100 nodes: key setup seconds, and a 1e6-float secure sum over the plain one.
SETUP_TARGET_100 = 3.0
RATIO_TARGET_100 = 3.0


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for r in result["runs"]:
        rows.append(
            f"| {r['floats']:,} | {r['nodes']} | {r.get('degree', r['nodes'] - 1)} | "
            f"{r['secagg_seconds']:.3f} | "
            f"{r['plain_seconds']:.3f} | {r['ratio']:.2f} | "
            f"{r['secagg_masked_round_seconds']:.3f} / {r['secagg_unmask_round_seconds']:.3f} | "
            f"{r['secagg_bytes'] / 1e6:.2f} | {r['plain_bytes'] / 1e6:.2f} | "
            f"{r['setup_seconds']:.2f} |"
        )
    drop_rows = [f"| {d['floats']:,} | {d['nodes']} | {d['seconds']:.3f} | "
                 f"{d['confirm_round_seconds']:.3f} | {d['unmask_round_seconds']:.3f} | "
                 f"{d['over_clean_sum']:.2f} | {d['over_plain_sum']:.2f} | "
                 f"{d['bytes'] / 1e6:.2f} |" for d in result.get("dropouts", [])]
    sims = ", ".join(f"{n} nodes: {s['simulation_seconds']:.0f} s, peak memory in use "
                     f"{s['peak_memory_gib']:.1f} GiB (+{s['memory_increase_gib']:.1f})"
                     for n, s in result["simulations"].items())
    rounds = sorted({r["setup_rounds"] for r in result["runs"] if "setup_rounds" in r})
    setup_rounds = " or ".join(map(str, rounds)) + " rounds" if rounds else "rounds"
    text = f"""# Secure sum vs plain sum

Median wall time of one sum over {result['repeats']} sums (plain and secure interleaved), in a
Flower {result['flwr_version']} simulation (Ray backend, `num_cpus=1` per ClientApp,
{result['cpus']} CPU cores), one simulation per node count, handler `diag_secure_sum` (one
array of standard-normal floats, `max_abs=10`). SecAgg+ uses the automatic neighbour graph
(`secagg-degree = 0`: complete up to 32 nodes, 2 ceil(log2 n) neighbours above); its time
covers the masked-input round and the unmask round; key setup ({setup_rounds}: advertise
mask and mail keys, share a batch of self-mask seeds) is reported separately and not included. Bytes are requests + replies as
Flower serializes them (Messenger ledger), per sum. Every secure sum matched the plain sum
within the fixed-point resolution. Produced by `python benchmarks/secure.py`.

| floats | nodes | neighbours | SecAgg+ (s) | plain (s) | ratio | SecAgg+ masked / unmask round (s) | SecAgg+ MB | plain MB | key setup (s) |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

A sum with one dropout (the last sum of each simulation: every node allows dropouts, the
server discards one node's masked input): the survivors sign the survivor and dropped lists
in a consistency round before the unmasking, and the dropped node's pairwise keys are
revealed. Without dropouts neither happens (the default policy abandons such a sum).

| floats | nodes | with one dropout (s) | consistency round (s) | unmask round (s) | over the sum without dropouts | over the plain sum | MB |
|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(drop_rows)}

Simulations: {sims}.

{result['notes']}
"""
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--floats", type=int, nargs="+", default=[1000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--notes", type=Path, default=None,
                        help="file whose text becomes the 'notes' paragraph")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "secure.json")
    args = parser.parse_args(argv)

    runs, sims, profiles, dropouts = [], {}, {}, []
    for i, n in enumerate(sorted(args.nodes)):
        res = run_sim(n, sorted(args.floats), args.repeats, args.profile and i == 0)
        runs.extend(res["runs"])
        dropouts.append(res["dropout"])
        sims[str(n)] = {k: res[k] for k in ("simulation_seconds", "peak_memory_gib",
                                            "memory_increase_gib")}
        if "profile" in res:
            profiles = res["profile"]
    target = next((r for r in runs if r["floats"] == 1_000_000 and r["nodes"] == 10), None)
    notes = args.notes.read_text().strip() if args.notes else ""
    if target is not None:
        met = target["ratio"] < TARGET_RATIO
        notes = (f"Target: SecAgg+ at 1e6 floats and 10 nodes below {TARGET_RATIO:g}x the plain "
                 f"sum: {target['ratio']:.2f}x, {'met' if met else 'MISSED'}. " + notes)
    at100 = next((r for r in runs if r["floats"] == 1_000_000 and r["nodes"] == 100), None)
    if at100 is not None:
        notes += (f" At 100 nodes: key setup {at100['setup_seconds']:.2f} s (target <= "
                  f"{SETUP_TARGET_100:g} s: {'met' if at100['setup_seconds'] <= SETUP_TARGET_100 else 'MISSED'}), "
                  f"a 1e6-float sum {at100['ratio']:.2f}x the plain sum (target <= "
                  f"{RATIO_TARGET_100:g}x: {'met' if at100['ratio'] <= RATIO_TARGET_100 else 'MISSED'}).")
    result = {
        "runs": runs, "dropouts": dropouts, "notes": notes, "simulations": sims,
        "profile": profiles,
        "repeats": args.repeats, "max_abs": MAX_ABS, **machine_info(),
    }
    write_report(args.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
