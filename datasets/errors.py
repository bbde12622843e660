"""Error type for malformed data, so callers can tell bad input from bugs."""


class DataError(ValueError):
    """A data file or data-derived value is malformed.

    Subclasses ValueError so generic "bad input" handlers still catch it, while
    the message always names the file and the line or field at fault.
    """
