"""The one error type users see: a single line naming the file and the fix."""


class ToolkitError(Exception):
    """A failure caused by input or environment, reported as one line, never a traceback."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
