"""The one exception type the command line turns into a one-line message (no traceback)."""


class HiResUserError(Exception):
    """Bad input from the user: the message names the problem and the fix."""


__all__ = ["HiResUserError"]
