"""The error every layer raises for a bad configuration value, in a leaf module so that data, tasks, checkpoints and
guards can raise it without importing ``mlmlab.config`` (which imports them to check files and values)."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and the allowed values."""
