"""One exception type for user-facing failures: the CLI prints its message on one line and exits non-zero."""


class DistillError(Exception):
    """Bad input, bad config or an unusable environment: said in one line, never as a traceback."""
