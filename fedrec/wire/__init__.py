"""Wire declarations: the record keys, message types and signed digests both sides of a
mechanism or protocol agree on, declared once.

Each module declares its node actions as a ``class Action(StrEnum)`` and the names of its
records (and of the arrays or fields both sides name) as upper-case module strings;
``tests/test_wire.py`` fails when a side spells one of them as a literal."""
