#!/usr/bin/env python
"""Run a fedrec-privacy protocol end to end in a Flower simulation and print its results.

The default protocol is PriviRec (``--protocol privirec``: graph filters from secure sums
and a power method, SecAgg+), on the embedded synthetic data, beside its centralized
reference and item popularity; ``--help`` lists every protocol.

    python run_simulation.py                       # PriviRec on the embedded synthetic data
    python run_simulation.py --protocol fedmf --dataset ml-100k --nodes 10 --rounds 50
    python run_simulation.py --protocol fedmf --set mf-dim=32 --set mf-lr=0.1
    python run_simulation.py --dataset my-data --data-dir /path   # /path/my-data/train.npz ...

Results go to results/runs/<run-name>.json (config, metrics, bytes, times). The default
name gets a -2, -3, ... suffix when the file exists; a --run-name that exists is refused
unless --overwrite. Ctrl-C stops the run and writes its partial results (status
"interrupted"); exit status 130.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from clients.policy import PolicyError
from datasets.errors import DataError
from fedrec.config import (
    CORE_KEYS,
    ROUNDS,
    ConfigError,
    RunConfig,
    key_table,
    parse_assignments,
)
from fedrec.results import ResultsError
from fedrec.secure.secagg import SecAggError
from fedrec.transport.messenger import NodeError, NodeTimeoutError, RunInterrupted
from fl_app.registry import protocols, resolve_config
from strategies.policy_needs import PolicyRefusal
from strategies.refusals import SettingRefused

DEFAULTS = {name: key.default for name, key in key_table(CORE_KEYS).items()}
#: How a node names the policy key it refused on (clients/policy.py ``NodePolicy.require``).
_REFUSED_KEY = re.compile(r"\(([a-z-]+)=false; policy:")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help only when the help does not already say
    what the default is and the default is a value (not ``""``, ``[]``, None or False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        empty = default is None or default is False or default is argparse.SUPPRESS or (
            isinstance(default, (str, list)) and not default)
        if "default" in text or empty or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Run a privacy-preserving federated recommendation protocol in a Flower "
                    "simulation.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--protocol", default=DEFAULTS["protocol"],
                   help="one of: " + "; ".join(f"{r.name} ({r.summary})"
                                              for r in protocols().values())
                   + "; or package.module:ClassName of your own ProtocolStrategy")
    p.add_argument("--strategy", default="",
                   help="a plain Flower Strategy 'module:Class' driving the protocol's clients")
    p.add_argument("--dataset", default=DEFAULTS["dataset"],
                   help="synthetic | ml-100k | ml-1m | gowalla | yelp2018 | lightgcn, or any "
                        "other name: your own split in <data-dir>/<name>/ (train.npz + test.npz or "
                        "train.txt + test.txt; docs/datasets.md)")
    p.add_argument("--data-dir", default="", help="where real data lives (default: $FEDREC_DATA "
                   "or ../shared/data)")
    p.add_argument("--nodes", type=int, default=4, help="number of simulated SuperNodes")
    p.add_argument("--partition", default=DEFAULTS["partition"],
                   help="user | shards-contiguous | shards-random | row-blocks | silo-zip")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"training rounds, for a protocol that trains in rounds (default: "
                        f"{ROUNDS.default}; any other protocol refuses the flag)")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="seeds every random draw")
    p.add_argument("--output", default="", help="results directory (default: ./results)")
    p.add_argument("--run-name", default="", help="results file stem (default: "
                   "<protocol>-<dataset>-<seed>, with -2, -3, ... if that file exists)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results of an earlier run with the same --run-name")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other run-config key (see docs/configuration.md); repeatable")
    p.add_argument("--node-policy", action="append", default=[], metavar="KEY=VALUE",
                   help="every simulated node's own privacy policy, e.g. allow-plain=true "
                        "(needed with --set aggregator=plain); see docs/threat-model.md")
    p.add_argument("--no-compare", action="store_true",
                   help="skip the centralized reference and item-popularity rows")
    p.add_argument("--quiet", action="store_true", help="no results table")
    p.add_argument("--verbose-flower", action="store_true", help="show Flower's INFO logs")
    return p


def _error(message: str, *hints: str) -> int:
    """Report a user's mistake or a node's refusal: one ``error:`` line (and hint lines)."""
    print(f"error: {message}", file=sys.stderr)
    for hint in hints:
        print(f"hint: {hint}", file=sys.stderr)
    return 2


def policy_hints(message: str) -> list[str]:
    """How to change every simulated node's policy from this command line, if ``message``
    is a node's policy refusal (the node itself names the Python and environment routes)."""
    if "node policy" not in message:
        return []
    match = _REFUSED_KEY.search(message)
    example = f"{match.group(1)}=true" if match else "KEY=VALUE"
    return [f"set the simulated nodes' policy with --node-policy {example} "
            "(docs/threat-model.md says what each key allows)"]


def refusal_flags(exc: Exception) -> list[str]:
    """The flags of this command that answer a refusal met before Flower starts: ``--set``
    for a run-config value, ``--node-policy`` for the simulated nodes' opt-ins."""
    from fl_app.plan import PolicyNotAllowed

    if isinstance(exc, SettingRefused):
        return [f"--set {exc.assignment}"]
    if isinstance(exc, PolicyNotAllowed):
        return [f"--node-policy {n.opt_in}" for n in exc.needs]
    return []


def refusal_text(exc: Exception) -> str:
    """A refusal in this command's terms (a policy refusal names no Python route)."""
    from fl_app.plan import PolicyNotAllowed

    if isinstance(exc, PolicyNotAllowed):
        return (f"every simulated node would refuse this run's {exc.refused} (node policy "
                f"{exc.has})")
    return str(exc)


def report_refusals(problems: list[Exception]) -> int:
    """Every refusal met before Flower started, in one ``error:`` line, and one ``hint:``
    line with every flag that answers them: the next try can fix them all."""
    flags = [flag for exc in problems for flag in refusal_flags(exc)]
    hints = [f"run again with {' '.join(flags)}"] if flags else []
    if any("--node-policy" in flag for flag in flags):
        hints = [hints[0] + " (docs/threat-model.md says what each --node-policy key allows)"]
    return _error("; ".join(refusal_text(exc) for exc in problems), *hints)


def given_keys(args: argparse.Namespace) -> dict[str, Any]:
    """The run-config keys this command line names: its flags and ``--set`` pairs. The
    flags of keys every run reads always count; ``--rounds`` only when typed, since a
    protocol without rounds refuses it (:func:`fl_app.registry.resolve_config`)."""
    given: dict[str, Any] = {
        "protocol": args.protocol, "strategy": args.strategy, "dataset": args.dataset,
        "data-dir": args.data_dir, "partition": args.partition, "seed": args.seed,
        "run-name": args.run_name,
    }
    if args.rounds is not None:
        given["rounds"] = args.rounds
    return {**given, **parse_assignments(args.set)}


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run's typed config, resolved once from this command line: what the command
    plans the run from (:func:`fl_app.plan.plan_run` takes it as it is)."""
    given = given_keys(args)
    return resolve_config(given)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from fl_app.plan import PolicyNotAllowed, RunRefused, plan_run, resolve_node_policy
    from fl_app.simulation import run_plan

    try:
        cfg = run_config(args)
        node_policy = parse_assignments(args.node_policy, "--node-policy")
    except ConfigError as exc:
        return _error(str(exc))
    try:
        policy = resolve_node_policy(node_policy or None)
    except ConfigError as exc:
        text = str(exc).removeprefix("node policy: ")
        return _error(f"--node-policy: {text}" if node_policy else text)
    if not args.quiet:  # progress of long runs: phase starts and slow rounds
        import logging

        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
        fedrec_log = logging.getLogger("fedrec")
        fedrec_log.addHandler(handler)
        fedrec_log.setLevel(logging.INFO)
        fedrec_log.propagate = False
    if args.output:
        import os
        os.environ["FEDREC_RESULTS"] = args.output
    try:  # the results file is claimed first: nothing is lost at the end
        with plan_run(cfg, args.nodes, policy, overwrite=args.overwrite) as plan:
            run_plan(plan, quiet=args.quiet, verbose_flower=args.verbose_flower,
                     compare=not args.no_compare)
    except RunInterrupted:  # the ServerApp wrote the partial results under the claimed name
        where = plan.results_path  # the plan was made: only running it is interrupted
        print(f"interrupted: partial results written to {where}" if where.is_file() else
              "interrupted", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before Flower started or after it stopped (references)
        print("interrupted", file=sys.stderr)
        return 130
    except RunRefused as exc:  # before Flower started, every refusal at once
        return report_refusals(exc.problems)
    except (PolicyNotAllowed, SettingRefused) as exc:  # before Flower or at the handshake
        return report_refusals([exc])
    except (ConfigError, DataError, ResultsError, FileNotFoundError, NodeTimeoutError,
            NodeError, PolicyError, PolicyRefusal, SecAggError) as exc:
        # Bad input and node failures are one line; any other error (a bug, a user's own
        # protocol raising) keeps its traceback.
        refused = isinstance(exc, (NodeError, PolicyError, PolicyRefusal))  # by a node
        return _error(str(exc), *(policy_hints(str(exc)) if refused else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
