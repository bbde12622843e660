"""A node's typed state: a dataclass kept in Flower's node state, checked when read back.

Why typed: state records read field by field by hand failed deep in a handler, or not at
all, when one was corrupted or stale (a KeyError mid-sum, a history silently cut short).
A state class is a ``fedrec.wire.message.Message`` declared with ``@message()`` whose
``CONFIG`` and ``ARRAYS`` name its own node-state records (never the wire's), its fields
declared with ``reply(...)`` (whose refusals never echo a value: a state holds secrets). It
lives beside the handlers that own it; it never travels, so it is not in ``fedrec/wire``.
Every field is checked on reload against its declaration (type, minimum, choices, shape),
as Flower's SecAgg+ state dataclass and Opacus's ``state_dict`` are.

A mechanism that keeps one state per name the server chooses (the key relay's secret per
purpose) passes that name as ``key``: the state then lives in records ``CONFIG.<key>`` and
``ARRAYS.<key>`` (:func:`state_keys` lists the keys held), each instance checked alike.

A state whose arrays a round reads and writes a few at a time (LP-GCN's rows and setup,
where rewriting every array each round dominated the round) keeps them in its ``ARRAYS``
record itself and checks them with :func:`check_state` when it reloads them, the same
checks and refusals as :func:`load_state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from fedrec.wire.message import Message, WireError

M = TypeVar("M", bound=Message)


def _check_state_class(cls: type[Message]) -> None:
    """A node-state class names its own records (``CONFIG``, ``ARRAYS``), distinct and
    never the wire's."""
    if cls.CONFIG in (Message.CONFIG, cls.ARRAYS) or cls.ARRAYS == Message.ARRAYS:
        raise TypeError(f"{cls.__qualname__}: a node state names its own records "
                        "(CONFIG, ARRAYS), distinct and never the wire's")


def _names(cls: type[Message], key: str | None) -> tuple[str, str]:
    """The records (config, arrays) of the state ``cls`` kept under ``key`` (None: the one
    state of its class). Keyed, neither record name may extend the other's: a key chosen
    by the server must never name another key's record (``ARRAYS = CONFIG + '.arrays'``
    would make key ``arrays.x``'s config record key ``x``'s arrays)."""
    _check_state_class(cls)
    if key is None:
        return cls.CONFIG, cls.ARRAYS
    if cls.ARRAYS.startswith(f"{cls.CONFIG}.") or cls.CONFIG.startswith(f"{cls.ARRAYS}."):
        raise TypeError(f"{cls.__qualname__}: a keyed node state's records (CONFIG, ARRAYS) "
                        "may not extend one another")
    return f"{cls.CONFIG}.{key}", f"{cls.ARRAYS}.{key}"


def load_state(state: RecordDict, cls: type[M], who: str, key: str | None = None, *,
               dims: Mapping[str, int] | None = None) -> M | None:
    """The state of type ``cls`` (under ``key``) as :func:`save_state` kept it in ``state``,
    or None before the first save (no config record); a record off its declaration is
    refused naming the record and the field, never a value. ``dims`` fixes shape symbols
    to sizes the node knows (``users`` = its users), as ``NodeContext.read`` does."""
    config, arrays = _names(cls, key)
    if config not in state:
        return None
    view = state
    if key is not None:  # the keyed records under the names the class reads
        view = RecordDict({cls.CONFIG: state[config]})
        if arrays in state:
            view[cls.ARRAYS] = state[arrays]
    try:
        return cls.from_records(view, who, dims)
    except WireError as exc:
        raise _refused(cls, config, who, exc) from None
    except (ValueError, TypeError) as exc:  # an array record that does not deserialise
        raise WireError(f"{who}: its node state '{arrays}' of {cls.__qualname__} does "
                        f"not deserialise ({type(exc).__name__})") from None


def check_state(cls: type[M], arrays: Mapping[str, np.ndarray], config: Mapping[str, Any],
                who: str, record: str, dims: Mapping[str, int] | None = None) -> M:
    """``cls`` from arrays and scalars a node kept by other means than :func:`save_state`
    (a state whose arrays it reads and writes one by one), every field checked as
    :func:`load_state` checks it; refused naming ``record`` and the field, never a value."""
    try:
        return cls.from_parts(arrays, config, who, dims)
    except WireError as exc:
        raise _refused(cls, record, who, exc) from None


def _refused(cls: type[Message], record: str, who: str, exc: WireError) -> WireError:
    """The refusal of a kept state off its declaration: a reply field's refusal names its
    type, never its value; the node's state is no request."""
    why = str(exc).removeprefix(f"{who} refuses the request: ")
    return WireError(f"{who}: its node state '{record}' does not match "
                     f"{cls.__qualname__} (corrupted or stale): {why}")


def save_state(state: RecordDict, msg: Message, key: str | None = None) -> None:
    """Keep ``msg`` in ``state`` (under ``key``), replacing the records an earlier save of
    its class (and key) wrote (an optional array now None leaves no stale copy). Its config
    record is written even when empty: it marks the state kept."""
    cls = type(msg)
    config, arrays = _names(cls, key)
    records = msg.to_records()
    state.pop(arrays, None)
    state[config] = records.get(cls.CONFIG, ConfigRecord())
    if cls.ARRAYS in records:
        state[arrays] = records[cls.ARRAYS]


def drop_state(state: RecordDict, cls: type[Message], key: str | None = None) -> None:
    """Forget the state of type ``cls`` (under ``key``): a later load finds none."""
    for name in _names(cls, key):
        state.pop(name, None)


def state_keys(state: RecordDict, cls: type[Message]) -> list[str]:
    """The keys under which ``state`` holds a state of type ``cls``, in the order kept."""
    prefix = _names(cls, "")[0]  # "CONFIG."
    return [name.removeprefix(prefix) for name in state if name.startswith(prefix)]


@dataclass(frozen=True)
class NodeState:
    """The typed state over a bare Flower node state, for code that holds the state and
    not the handler's ``NodeContext`` (the mailbox, a node's identity, the relay's readers);
    ``who`` names the node in refusals."""

    state: RecordDict
    who: str

    def load_state(self, cls: type[M], key: str | None = None, *,
                   dims: Mapping[str, int] | None = None) -> M | None:
        """:func:`load_state` on this node's state."""
        return load_state(self.state, cls, self.who, key, dims=dims)

    def save_state(self, msg: Message, key: str | None = None) -> None:
        """:func:`save_state` on this node's state."""
        save_state(self.state, msg, key)

    def drop_state(self, cls: type[Message], key: str | None = None) -> None:
        """:func:`drop_state` on this node's state."""
        drop_state(self.state, cls, key)

    def state_keys(self, cls: type[Message]) -> list[str]:
        """:func:`state_keys` on this node's state."""
        return state_keys(self.state, cls)
