"""A node's typed state: a dataclass kept in Flower's node state, checked when read back.

Why typed: state records read field by field by hand failed deep in a handler, or not at
all, when one was corrupted or stale (a KeyError mid-sum, a history silently cut short).
A state class is a ``fedrec.wire.message.Message`` declared with ``@message()`` whose
``CONFIG`` and ``ARRAYS`` name its own node-state records (never the wire's), its fields
declared with ``reply(...)`` (whose refusals never echo a value: a state holds secrets). It
lives beside the handlers that own it; it never travels, so it is not in ``fedrec/wire``.
Every field is checked on reload against its declaration (type, minimum, choices, shape),
as Flower's SecAgg+ state dataclass and Opacus's ``state_dict`` are.
"""

from __future__ import annotations

from typing import TypeVar

from flwr.app import ConfigRecord, RecordDict

from fedrec.wire.message import Message, WireError

M = TypeVar("M", bound=Message)


def _check_state_class(cls: type[Message]) -> None:
    """A node-state class names its own records (``CONFIG``, ``ARRAYS``), distinct and
    never the wire's."""
    if cls.CONFIG in (Message.CONFIG, cls.ARRAYS) or cls.ARRAYS == Message.ARRAYS:
        raise TypeError(f"{cls.__qualname__}: a node state names its own records "
                        "(CONFIG, ARRAYS), distinct and never the wire's")


def load_state(state: RecordDict, cls: type[M], who: str) -> M | None:
    """The state of type ``cls`` as :func:`save_state` kept it in ``state``, or None before
    the first save (no record ``cls.CONFIG``); a record off its declaration is refused
    naming the record and the field, never a value."""
    _check_state_class(cls)
    if cls.CONFIG not in state:
        return None
    try:
        return cls.from_records(state, who)
    except WireError as exc:  # a reply field's refusal names its type, not its value
        why = str(exc).removeprefix(f"{who} refuses the request: ")
        raise WireError(f"{who}: its node state '{cls.CONFIG}' does not match "
                        f"{cls.__qualname__} (corrupted or stale): {why}") from None
    except (ValueError, TypeError) as exc:  # an array record that does not deserialise
        raise WireError(f"{who}: its node state '{cls.ARRAYS}' of {cls.__qualname__} does "
                        f"not deserialise ({type(exc).__name__})") from None


def save_state(state: RecordDict, msg: Message) -> None:
    """Keep ``msg`` in ``state``, replacing the records an earlier save of its class wrote
    (an optional array now None leaves no stale copy). Its config record is written even
    when empty: it marks the state kept."""
    cls = type(msg)
    _check_state_class(cls)
    records = msg.to_records()
    state.pop(cls.ARRAYS, None)
    state[cls.CONFIG] = records.get(cls.CONFIG, ConfigRecord())
    if cls.ARRAYS in records:
        state[cls.ARRAYS] = records[cls.ARRAYS]
