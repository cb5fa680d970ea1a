"""The one root of lmconvert's own exceptions, each carrying the exit code it means, so the CLI maps
errors to exit codes by one attribute and no room needs to know another's errors. It lives in the
lowest room, which every other imports. The root's own code is 3: an error of ours that is neither
bad input nor a failed check is a bug."""


class LmconvertError(Exception):
    exit_code = 3


class BadInput(LmconvertError):
    """Bad input or usage (exit 2): the message names the file or argument, what is wrong, what to do."""

    exit_code = 2


class CheckFailed(LmconvertError):
    """A parity or integrity check failed (exit 1): the model or its bytes are not what was promised."""

    exit_code = 1


class ConfigError(BadInput, ValueError):
    """A config value is invalid; the message names the field and the value."""
