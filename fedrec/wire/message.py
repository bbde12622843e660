"""Typed messages: a request or reply declared once as a dataclass, one codec to and from
Flower records.

Why: both sides used to spell a field's name as a string literal and read it by hand, so a
name could drift and nothing said which field of a request the run fixes and which the
server may change per round -- exactly what a node must check. A message declares, per
field, its wire name, its type (``int``, ``float``, ``bool``, ``str``, ``bytes``, lists of
those, or an ``np.ndarray`` with a symbolic shape) and, for a request field, what the run
contract says of it (:class:`Fixed`). :meth:`Message.to_records` builds the Flower
``RecordDict`` (arrays in one ``ArrayRecord``, scalars in one ``ConfigRecord``);
:meth:`Message.from_records` reads one back, refusing a missing field, a wrong type, a
value under its minimum, a shape that does not match, naming the field and what was
expected (never a value the node computed).

A protocol's wire module declares::

    @message(Action.TRAIN)
    class TrainRequest(Message):
        V: np.ndarray = per_round(shape=("items", "dim"))
        seed: int = run_fixed()
        round: int = per_round(min=1)

and the server sends ``fed.sum(TrainRequest(V=V, seed=s, round=r), TrainSum, ...)``; the
node reads ``node.read(TrainRequest, items=n_items)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import types
import typing
from collections.abc import Callable, Mapping
from enum import StrEnum
from functools import cache
from typing import Any, ClassVar, Self, TypeVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedrec.records import to_array_record
from fedrec.wire.request import ARRAYS, CONFIG

#: Metadata key of a message field's declaration (:class:`Spec`).
_SPEC = "fedrec.wire"


class Fixed(StrEnum):
    """What the run contract says of a request field (and how a node treats it)."""

    #: Fixed for the run: the node pins the first value it reads (per message type) in its
    #: run state and refuses a later request that changes it, naming the field.
    RUN = "run"
    #: Chosen per round by the server (the model it sends, the round number, a sum's id).
    ROUND = "round"
    #: Something the node can derive from what it holds; sent only as a cross-check, which
    #: the node's handler makes against its own value.
    DERIVED = "derived"
    #: A field of a reply (what the node computed).
    REPLY = "reply"


class WireError(ValueError):
    """A message that does not match its declaration (missing field, wrong type or shape,
    a value under the field's minimum, a run-fixed field changed within a run)."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """A field's declaration: wire name, what the run contract says, array shape (symbols
    name sizes that must agree across fields or with the reader's ``dims``), minimum,
    allowed values, and whether it may be absent (its default then stands)."""

    fixed: Fixed
    name: str | None = None
    shape: tuple[str | int, ...] | None = None
    min: float | None = None
    choices: tuple[Any, ...] | None = None
    doc: str = ""


def _field(fixed: Fixed, default: Any = dataclasses.MISSING, *, name: str | None = None,
           shape: tuple[str | int, ...] | None = None, min: float | None = None,
           choices: tuple[Any, ...] | None = None, doc: str = "") -> Any:
    spec = Spec(fixed, name, tuple(shape) if shape is not None else None, min,
                tuple(choices) if choices is not None else None, doc)
    if isinstance(default, list):  # a list default: each message gets its own copy
        items = tuple(default)
        return dataclasses.field(default_factory=lambda: list(items), metadata={_SPEC: spec})
    return dataclasses.field(default=default, metadata={_SPEC: spec})


def run_fixed(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A request field the run contract fixes (:attr:`Fixed.RUN`)."""
    return _field(Fixed.RUN, default, **kw)


def per_round(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A request field the server may change per round (:attr:`Fixed.ROUND`)."""
    return _field(Fixed.ROUND, default, **kw)


def derived(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A request field the node can derive itself (:attr:`Fixed.DERIVED`)."""
    return _field(Fixed.DERIVED, default, **kw)


def reply(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A reply field (:attr:`Fixed.REPLY`)."""
    return _field(Fixed.REPLY, default, **kw)


@dataclasses.dataclass(frozen=True)
class WireField:
    """One resolved field: attribute, wire name, base type, whether a list, optional."""

    attr: str
    name: str
    kind: type
    is_list: bool
    optional: bool
    has_default: bool
    spec: Spec

    @property
    def is_array(self) -> bool:
        return self.kind is np.ndarray


_SCALARS = (int, float, bool, str, bytes)


def _resolve(hint: Any, where: str) -> tuple[type, bool, bool]:
    """(base type, is a list, optional) of a field's annotation."""
    optional = False
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"{where}: a union other than X | None cannot travel")
        optional, hint = True, args[0]
        origin = typing.get_origin(hint)
    if origin is list:
        (inner,) = typing.get_args(hint)
        if inner not in _SCALARS:
            raise TypeError(f"{where}: list of {inner!r} cannot travel in a ConfigRecord")
        return inner, True, optional
    if hint is np.ndarray or origin is np.ndarray:
        return np.ndarray, False, optional
    if hint in _SCALARS:
        return hint, False, optional
    raise TypeError(f"{where}: type {hint!r} cannot travel (int, float, bool, str, bytes, "
                    "lists of them, np.ndarray)")


M = TypeVar("M", bound="Message")


def message(action: str | None = None) -> Callable[[type[M]], type[M]]:
    """Class decorator: a frozen, keyword-only dataclass message, sent as ``action`` when it
    is a request (replies and shared bases take no action)."""

    def deco(cls: type[M]) -> type[M]:
        out = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        out.ACTION = None if action is None else str(action)
        wire_fields(out)  # resolve now: a declaration error shows at import, not in a run
        return out

    return deco


@cache
def wire_fields(cls: type[Message]) -> tuple[WireField, ...]:
    """The declared fields of a message class, resolved once."""
    hints = typing.get_type_hints(cls)
    out = []
    seen: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_SPEC)
        if spec is None:
            raise TypeError(f"{cls.__qualname__}.{f.name}: declare it with run_fixed(), "
                            "per_round(), derived() or reply()")
        name = spec.name or f.name.replace("_", "-")
        if name in seen:
            raise TypeError(f"{cls.__qualname__}: wire name {name!r} used by {seen[name]} "
                            f"and {f.name}")
        seen[name] = f.name
        kind, is_list, optional = _resolve(hints[f.name], f"{cls.__qualname__}.{f.name}")
        has_default = (f.default is not dataclasses.MISSING
                       or f.default_factory is not dataclasses.MISSING)
        out.append(WireField(f.name, name, kind, is_list, optional, has_default, spec))
    return tuple(out)


def _expected(f: WireField) -> str:
    base = "array" if f.is_array else f.kind.__name__
    return f"list of {base}" if f.is_list else base


class Message:
    """Base of every typed request and reply (declare subclasses with :func:`message`)."""

    #: The action a request is sent as (set by :func:`message`; None for a reply).
    ACTION: ClassVar[str | None] = None
    #: The ConfigRecord its scalar fields travel in, and the ArrayRecord of its arrays.
    CONFIG: ClassVar[str] = CONFIG
    ARRAYS: ClassVar[str] = ARRAYS

    # -- encoding -------------------------------------------------------------------------
    def to_arrays(self) -> dict[str, np.ndarray]:
        """The array fields by wire name (absent optional arrays left out)."""
        return {f.name: getattr(self, f.attr) for f in wire_fields(type(self))
                if f.is_array and getattr(self, f.attr) is not None}

    def to_config(self) -> dict[str, Any]:
        """The scalar fields by wire name (None left out)."""
        out: dict[str, Any] = {}
        for f in wire_fields(type(self)):
            value = getattr(self, f.attr)
            if f.is_array or value is None:
                continue
            out[f.name] = list(value) if f.is_list else value
        return out

    def to_records(self) -> RecordDict:
        """The message as Flower records: arrays in :attr:`ARRAYS`, scalars in :attr:`CONFIG`."""
        content = RecordDict()
        arrays, config = self.to_arrays(), self.to_config()
        if arrays:
            content[self.ARRAYS] = to_array_record(arrays)
        if config:
            content[self.CONFIG] = ConfigRecord(config)
        return content

    # -- decoding -------------------------------------------------------------------------
    @classmethod
    def from_records(cls, content: RecordDict, who: str = "the message",
                     dims: Mapping[str, int] | None = None) -> Self:
        """Read a message of this type from Flower records (see :meth:`from_parts`)."""
        arrays_record = content.get(cls.ARRAYS)
        config_record = content.get(cls.CONFIG)
        # only the arrays this message declares are unpacked (a sum record's message must not
        # copy the request's model before the node has checked its size)
        wanted = {f.name for f in wire_fields(cls) if f.is_array}
        arrays = ({name: arrays_record[name].numpy() for name in arrays_record
                   if name in wanted} if isinstance(arrays_record, ArrayRecord) and wanted
                  else {})
        config = dict(config_record) if isinstance(config_record, ConfigRecord) else {}
        return cls.from_parts(arrays, config, who, dims)

    @classmethod
    def from_parts(cls, arrays: Mapping[str, np.ndarray], config: Mapping[str, Any],
                   who: str = "the message", dims: Mapping[str, int] | None = None) -> Self:
        """Check and type every declared field; unknown names are ignored (another layer's).

        ``dims`` gives sizes that shape symbols must equal (``items`` = the node's item
        count); symbols not in it must agree across the message's arrays. A scalar the
        server chose may be echoed in the refusal; an array's values never are."""
        values: dict[str, Any] = {}
        sizes: dict[str, int] = dict(dims or {})
        label = cls.__qualname__
        for f in wire_fields(cls):
            source = arrays if f.is_array else config
            if f.name not in source or source[f.name] is None:
                if f.has_default:
                    continue
                if f.optional:
                    values[f.attr] = None
                    continue
                raise WireError(f"{who} refuses the request: {label} has no field "
                                f"'{f.name}' (expected {_expected(f)})")
            raw = source[f.name]
            values[f.attr] = (_array(f, raw, who, label, sizes) if f.is_array
                              else _scalar(f, raw, who, label))
        return cls(**values)


def _scalar(f: WireField, raw: Any, who: str, label: str) -> Any:
    if f.is_list and not isinstance(raw, list):
        raise WireError(f"{who} refuses the request: {label} field '{f.name}' must be a list "
                        f"of {f.kind.__name__}, got {type(raw).__name__}")
    out = [_one(f, item, who, label) for item in (raw if f.is_list else [raw])]
    return out if f.is_list else out[0]


def _one(f: WireField, item: Any, who: str, label: str) -> Any:
    """One scalar: an int as ``NodeContext.size`` reads a size (a whole float or digit text
    taken, a bool, other text or a fraction refused, never rounded); a float from an int or
    float; the rest by type. The server's own value is echoed, a reply's never."""
    show = f.spec.fixed is not Fixed.REPLY
    got = (f", got {item!r}" if show else f", got {type(item).__name__}")
    value = item
    if f.kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        low = f.spec.min
        if not isinstance(value, int) or isinstance(value, bool) or \
                (low is not None and value < low):
            bound = f" >= {low:g}" if low is not None else ""
            raise WireError(f"{who} refuses the request: size '{f.name}' must be an integer"
                            f"{bound}{got}")
        return _chosen(f, value, who, got)
    if f.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, f.kind) or (f.kind is not bool and isinstance(value, bool)):
        raise WireError(f"{who} refuses the request: {label} field '{f.name}' must be "
                        f"{_expected(f)}{got}")
    if f.kind is float and not np.isfinite(value):
        raise WireError(f"{who} refuses the request: {label} field '{f.name}' must be a "
                        f"finite number{got}")
    if f.spec.min is not None and f.kind is float and not value >= f.spec.min:
        raise WireError(f"{who} refuses the request: {label} field '{f.name}' must be >= "
                        f"{f.spec.min:g}{got}")
    return _chosen(f, value, who, got)


def _chosen(f: WireField, value: Any, who: str, got: str) -> Any:
    if f.spec.choices is not None and value not in f.spec.choices:
        raise WireError(f"{who} refuses the request: field '{f.name}' must be one of "
                        f"{', '.join(map(repr, f.spec.choices))}{got}")
    return value


def _array(f: WireField, raw: Any, who: str, label: str, sizes: dict[str, int]) -> np.ndarray:
    a = np.asarray(raw)
    shape = f.spec.shape
    if shape is None:
        return a
    if a.ndim != len(shape):
        raise WireError(f"{who} refuses the request: {label} array '{f.name}' must have {len(shape)} "
                        f"dimension(s) ({', '.join(map(str, shape))}), got shape {a.shape}")
    for axis, (want, got) in enumerate(zip(shape, a.shape, strict=True)):
        if isinstance(want, int):
            ok, expected = got == want, str(want)
        else:
            expected = want if want not in sizes else f"{want} = {sizes[want]}"
            ok = sizes.setdefault(want, got) == got
        if not ok:
            raise WireError(f"{who} refuses the request: {label} array '{f.name}' has shape {a.shape}, axis "
                            f"{axis} expected {expected}")
    return a


def field_names(cls: type[Message]) -> tuple[str, ...]:
    """The wire names of a message's fields (for the wire tests)."""
    return tuple(f.name for f in wire_fields(cls))


def run_fixed_values(msg: Message) -> dict[str, Any]:
    """The run-fixed fields' wire values, for a node's pin (``clients.node.NodeContext``):
    scalars as they travel, arrays as (dtype, shape, SHA-256 of the bytes)."""
    out: dict[str, Any] = {}
    for f in wire_fields(type(msg)):
        if f.spec.fixed is not Fixed.RUN:
            continue
        value = getattr(msg, f.attr)
        if f.is_array and value is not None:
            value = (str(value.dtype), list(value.shape),
                     hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest())
        out[f.name] = value
    return out
