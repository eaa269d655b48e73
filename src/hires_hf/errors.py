"""The one exception type the command line turns into a one-line message (no traceback)."""


class HiResUserError(Exception):
    """Bad input from the user: the message names the problem and the fix."""


def first_line(error: BaseException) -> str:
    """The first line of a library's error: enough to name the problem inside a one-line message."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


__all__ = ["HiResUserError", "first_line"]
