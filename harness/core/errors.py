"""The one exception type for mistakes a user can make and fix."""


class TroughputError(Exception):
    """Bad config, bad input file, unknown knob or missing engine: the message says how to fix it."""
