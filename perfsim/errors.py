"""The three errors perfsim raises on purpose."""


class PerfsimError(Exception):
    """Base class of every error perfsim raises on purpose."""


class ConfigError(PerfsimError, ValueError):
    """Bad input: a profile, model, plan or CLI value that is missing or out of range."""


class InfeasiblePlan(PerfsimError):
    """A well-formed plan that cannot run: it does not fit in memory or does not divide."""
