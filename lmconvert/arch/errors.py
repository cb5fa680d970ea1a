"""The one exception type the canonical decoder raises for a bad configuration."""


class ConfigError(ValueError):
    """A config value is invalid; the message names the field and the value."""
