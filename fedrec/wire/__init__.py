"""Wire declarations: the record keys, message types and signed digests both sides of a
mechanism or protocol agree on, declared once."""
