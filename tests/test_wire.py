"""What travels between the server and a node is named once, in ``fedrec/wire``, and both
sides use those names (docs/architecture.md): a name spelled out again as a string literal on
one side can drift from the other side's spelling and nothing would say so until a run
fails. These tests read the sides' source (``strategies/``, ``clients/``,
``fedrec/transport/``) and the handler table, so a new literal or an undeclared action
fails here, naming the file and line.

What a wire module declares: its actions as the members of a ``class Action(StrEnum)``, and
the names of its records (and of arrays or fields both sides name) as upper-case
module-level strings; a ``*_PURPOSE`` string is a signing purpose, not a name.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from enum import StrEnum
from pathlib import Path

import pytest

import clients
import fedrec.wire
from fedrec.wire.message import Message, field_names

REPO = Path(__file__).resolve().parents[1]
#: The two sides of every protocol: the server's (strategies and the core's transport) and
#: the node's.
SERVER = ("strategies", "fedrec/transport")
NODE = ("clients",)
#: Flower's record views: a name read from one of these is a record name.
RECORD_VIEWS = ("config_records", "array_records", "metric_records")
#: The record helpers of ``fedrec/records.py`` that take a record name.
RECORD_HELPERS = ("config_record", "array_record", "arrays_of")
#: Literals that spell a wire name but mean something else in that file, with what they are
#: there (by file and string, so an edit elsewhere in the file keeps its place).
SECOND_MEANINGS = {
    ("clients/boundary.py", "dp-ledger"): "the node-config key of its DP ledger file",
    ("clients/sealed_node.py", "keys"): "a field of the node's own state record of mail keys",
    ("strategies/base.py", "protocol"): "the run-config key naming the protocol",
}


def _wire_modules() -> list[tuple[str, Path]]:
    return [(f"fedrec.wire.{m.name}", Path(fedrec.wire.__path__[0]) / f"{m.name}.py")
            for m in pkgutil.iter_modules(fedrec.wire.__path__)]


def _declared() -> tuple[dict[str, str], dict[str, str]]:
    """(actions, names): every declared string -> where it is declared (``module.NAME``)."""
    actions: dict[str, str] = {}
    names: dict[str, str] = {}
    for module, path in _wire_modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == "Action":
                for item in node.body:
                    if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant):
                        where = f"{module}.Action.{item.targets[0].id}"
                        assert item.value.value not in actions, \
                            f"action {item.value.value!r} declared twice: {where}, " \
                            f"{actions[item.value.value]}"
                        actions[item.value.value] = where
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id.isupper() and \
                        not target.id.endswith("_PURPOSE") and \
                        isinstance(node.value, ast.Constant) and \
                        isinstance(node.value.value, str):
                    assert node.value.value not in names, \
                        f"wire name {node.value.value!r} declared twice: {module}." \
                        f"{target.id}, {names[node.value.value]}"
                    names[node.value.value] = f"{module}.{target.id}"
    return actions, names


def _side_files(dirs: tuple[str, ...], root: Path = REPO) -> list[Path]:
    return sorted(p for d in dirs for p in (root / d).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _views(node: ast.AST) -> bool:
    """``<expr>.config_records`` (or another of Flower's record views)."""
    return isinstance(node, ast.Attribute) and node.attr in RECORD_VIEWS


def _record_positions(tree: ast.AST) -> set[int]:
    """The string constants where Flower's record API takes a record name: a subscript key,
    a key of the dict a ``RecordDict`` is built from, the left side of ``in`` a record view,
    the argument of a record view's ``get``, a record helper's name argument, and a
    function's default argument (a helper's default record)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            ids.add(id(node.slice))
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else \
                func.id if isinstance(func, ast.Name) else ""
            if called == "RecordDict":
                for arg in node.args:
                    if isinstance(arg, ast.Dict):
                        ids.update(id(k) for k in arg.keys if k is not None)
            elif called == "get" and isinstance(func, ast.Attribute) and _views(func.value):
                ids.update(id(a) for a in node.args[:1])
            elif called in RECORD_HELPERS:
                ids.update(id(a) for a in node.args[1:2])
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn))
                                                  for op in node.ops):
            if any(_views(c) for c in node.comparators):
                ids.add(id(node.left))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            ids.update(id(d) for d in node.args.defaults + node.args.kw_defaults
                       if d is not None)
    return ids


def _literals(dirs: tuple[str, ...], root: Path = REPO) -> list[str]:
    """Every string literal on the sides that spells a declared name, as
    ``file:line: 'name' (declared as module.NAME)``.

    An action, or a name holding more than letters (``relay-ack``, ``secagg.values``), is
    one wherever it appears. A name that is a plain word (``info``, ``keys``, ``ckks``) is
    also an ordinary word on the sides (``ckks`` is an aggregator mode, ``confirm`` a verb
    in refusals, ``protocol`` a run-config key), so it counts where the record API takes a
    record name (:func:`_record_positions`).
    """
    actions, names = _declared()
    found = []
    for path in _side_files(dirs, root):
        tree = ast.parse(path.read_text())
        positions = _record_positions(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            value = node.value
            where = actions.get(value) or names.get(value)
            if where is None:
                continue
            if (str(path.relative_to(root)), value) in SECOND_MEANINGS:
                continue
            if value in actions or not value.isalpha() or id(node) in positions:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {value!r} "
                             f"(declared as {where})")
    return found


def _project_handlers() -> tuple[dict[str, str], dict[str, str]]:
    """(query, diagnostic) actions the project's ``clients`` modules register -> handler.
    Every module of the package is imported, so every built-in handler registers; handlers
    that tests or examples registered in the same process are left out."""
    from clients.handlers import DIAGNOSTIC_HANDLERS, QUERY_HANDLERS

    for module in pkgutil.iter_modules(clients.__path__):
        importlib.import_module(f"clients.{module.name}")

    def ours(table: dict) -> dict[str, str]:
        return {str(name): f"{fn.__module__}.{fn.__qualname__}" for name, fn in table.items()
                if fn.__module__.split(".")[0] == "clients"}

    return ours(QUERY_HANDLERS), ours(DIAGNOSTIC_HANDLERS)


def _dotted(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _sent_actions(dirs: tuple[str, ...]) -> dict[str, str]:
    """Every declared action the modules under ``dirs`` name (``Action.X`` or
    ``<wire module>.Action.X``), resolved in the imported module -> first place named."""
    sent: dict[str, str] = {}
    for path in _side_files(dirs):
        module = importlib.import_module(_module_name(path))
        for node in ast.walk(ast.parse(path.read_text())):
            chain = _dotted(node) if isinstance(node, ast.Attribute) else None
            if chain is None:
                continue
            obj = vars(module).get(chain[0])
            for part in chain[1:]:
                if not (inspect.ismodule(obj) or inspect.isclass(obj)):
                    obj = None
                    break
                obj = getattr(obj, part, None)
            if isinstance(obj, StrEnum) and type(obj).__name__ == "Action" and \
                    type(obj).__module__.startswith("fedrec.wire."):
                sent.setdefault(obj.value, f"{path.relative_to(REPO)}:{node.lineno}")
        for node in ast.walk(ast.parse(path.read_text())):  # typed requests, by class name
            if isinstance(node, ast.Call):
                chain = _dotted(node.func)
                obj = vars(module).get(chain[0]) if chain else None
                for part in (chain or [])[1:]:
                    obj = getattr(obj, part, None)
                if inspect.isclass(obj) and issubclass(obj, Message) and obj.ACTION and \
                        obj.__module__.startswith("fedrec.wire."):
                    sent.setdefault(obj.ACTION, f"{path.relative_to(REPO)}:{node.lineno}")
    return sent


def test_the_sides_spell_no_wire_name() -> None:
    """No action or record name of ``fedrec/wire`` is a string literal in strategies/,
    clients/ or fedrec/transport/."""
    found = _literals(SERVER + NODE)
    for (file, value), meaning in SECOND_MEANINGS.items():  # each exception still applies
        assert any(isinstance(n, ast.Constant) and n.value == value
                   for n in ast.walk(ast.parse((REPO / file).read_text()))), (file, meaning)
    assert not found, "wire names spelled as literals (import them from fedrec/wire):\n" + \
        "\n".join(found)


def test_every_handler_answers_a_declared_action() -> None:
    """Every action a node registers a handler for is declared in ``fedrec/wire``, and every
    declared action has a handler (a diagnostic one for ``fedrec/wire/diagnostics.py``)."""
    actions, _ = _declared()
    query, diagnostic = _project_handlers()
    undeclared = sorted((set(query) | set(diagnostic)) - set(actions))
    assert not undeclared, f"handlers of undeclared actions: " \
        f"{[(a, query.get(a) or diagnostic.get(a)) for a in undeclared]}"
    diagnostics = {a for a, where in actions.items()
                   if where.startswith("fedrec.wire.diagnostics.")}
    assert set(diagnostic) == diagnostics, (sorted(diagnostic), sorted(diagnostics))
    unhandled = sorted(set(actions) - diagnostics - set(query))
    assert not unhandled, f"declared actions no node handles: " \
        f"{[(a, actions[a]) for a in unhandled]}"


def test_every_action_the_server_sends_is_handled() -> None:
    """Every declared action the server's side names has a node handler, and every declared
    action but the diagnostics is sent by the server (a declaration nothing sends is dead)."""
    actions, _ = _declared()
    query, _ = _project_handlers()
    sent = _sent_actions(SERVER)
    unhandled = sorted((a, where) for a, where in sent.items() if a not in query)
    assert not unhandled, f"the server sends actions no node handles: {unhandled}"
    unsent = sorted(a for a, where in actions.items()
                    if a not in sent and not where.startswith("fedrec.wire.diagnostics."))
    assert not unsent, f"declared actions the server never sends: {unsent}"


@pytest.mark.parametrize("literal, flagged", [
    ('ask("secagg_share", requests)', True),  # an action, anywhere
    ('x = {"relay-ack": 1}', True),  # a name with more than letters, anywhere
    ('reply.config_records.get("confirm")', True),  # a plain-word record, read as one
    ('RecordDict({"info": rec})', True),
    ('content["arrays"] = rec', True),
    ('if "policy" in reply.config_records: pass', True),
    ('def f(key="arrays"): pass', True),
    ('refuse(node, "confirm")', False),  # the same word, not as a record
    ('if mode == "ckks": pass', False),
])
def test_the_scan_flags_a_literal(tmp_path: Path, literal: str, flagged: bool) -> None:
    """The scan itself: a side module holding ``literal`` is flagged (or not) as stated."""
    (tmp_path / "side").mkdir()
    (tmp_path / "side" / "mod.py").write_text(literal + "\n")
    assert bool(_literals(("side",), root=tmp_path)) is flagged


# -- fields: every request and reply is a typed message (fedrec/wire/message.py) ------------
#: Literals that spell a message field's wire name but are another record's key in that
#: file (the node's own files and configuration, never a message), with what they are.
FIELD_SECOND_MEANINGS = {
    ("clients/dp_ledger.py", "epsilon"): "a key of the node's DP ledger file",
    ("clients/dp_ledger.py", "releases"): "a key of the node's DP ledger file",
    ("clients/dp_ledger.py", "rows"): "a key of the node's DP ledger file",
    ("clients/dp_ledger.py", "identity"): "a key of the node's DP ledger file",
    ("clients/policy.py", "epsilon"): "a field of the node state's record of its DP spending",
    ("clients/node.py", "partition-id"): "Flower's node-config key",
    ("clients/node.py", "role"): "the node-config key of the node's role",
    ("clients/identity_node.py", "partition-id"): "Flower's node-config key",
    ("clients/identity_node.py", "role"): "the node-config key of the node's role",
}


def _messages() -> dict[type[Message], str]:
    """Every typed message class the wire modules declare -> ``module.Class``."""
    out: dict[type[Message], str] = {}
    for module, _ in _wire_modules():
        for obj in vars(importlib.import_module(module)).values():
            if inspect.isclass(obj) and issubclass(obj, Message) and obj is not Message and \
                    obj.__module__ == module:
                out[obj] = f"{module}.{obj.__qualname__}"
    return out


def _field_names() -> dict[str, str]:
    """Every wire field name of a typed message -> where declared."""
    names: dict[str, str] = {}
    for cls, where in _messages().items():
        for name in field_names(cls):
            names.setdefault(name, f"{where}.{name}")
    return names


def _field_literals(dirs: tuple[str, ...], root: Path = REPO) -> list[str]:
    """String literals on the sides that spell a message field's wire name: one holding
    more than letters anywhere, a plain word where a record or mapping is read by key (a
    subscript, ``.get``) -- save a run-config key (``fl_app.registry.builtin_keys``), which
    a stock strategy's config carries under the same name."""
    from fl_app.registry import builtin_keys

    fields = _field_names()
    run_keys = set(builtin_keys())
    found = []
    for path in _side_files(dirs, root):
        tree = ast.parse(path.read_text())
        keyed: dict[int, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript):
                keyed[id(node.slice)] = ast.unparse(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "get" and node.args:
                keyed[id(node.args[0])] = ast.unparse(node.func.value)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            where = fields.get(node.value)
            if where is None:
                continue
            receiver = keyed.get(id(node))
            if node.value.isalpha() and receiver is None:
                continue
            if node.value in run_keys:  # a run-config key of the same name, not the field
                continue
            if (str(path.relative_to(root)), node.value) in FIELD_SECOND_MEANINGS:
                continue
            found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r} "
                         f"(a field of {where})")
    return found


def test_the_sides_spell_no_message_field() -> None:
    """No field of a typed request or reply is read or written by its name on the sides:
    they build and read the messages of ``fedrec/wire`` (``Federation.sum_of``,
    ``NodeContext.read``)."""
    found = _field_literals(SERVER + NODE)
    for (file, value), meaning in FIELD_SECOND_MEANINGS.items():  # each still applies
        assert any(isinstance(n, ast.Constant) and n.value == value
                   for n in ast.walk(ast.parse((REPO / file).read_text()))), (file, meaning)
    assert not found, "message fields spelled as literals (use the typed message):\n" + \
        "\n".join(found)


def test_every_message_declares_its_fields() -> None:
    """Every typed message resolves (types that travel, wire names unique) and a request's
    every field says what the run contract makes of it."""
    from fedrec.wire.message import Fixed, wire_fields

    messages = _messages()
    assert messages
    for cls in messages:
        for f in wire_fields(cls):
            if cls.ACTION is not None:
                assert f.spec.fixed is not Fixed.REPLY, (cls, f.name)


@pytest.mark.parametrize("literal, flagged", [
    ('x = cfg["batch-size"]', True),  # a field with more than letters, read by key
    ('y = {"loss-cap": 1.0}', True),  # ... or written anywhere
    ('v = node_arrays["V"]', True),  # a plain-word field read by key
    ('w = total.get("weight")', True),
    ('mode = "exact"', False),  # a plain word that is not read by key
    ('k = cfg["mf-lr"]', False),  # a run-config key of the same name as a stock field
])
def test_the_field_scan_flags_a_literal(tmp_path: Path, literal: str, flagged: bool) -> None:
    """The field scan itself: a side module holding ``literal`` is flagged (or not)."""
    (tmp_path / "side").mkdir()
    (tmp_path / "side" / "mod.py").write_text(literal + "\n")
    assert bool(_field_literals(("side",), root=tmp_path)) is flagged
