"""Errors a user can act on: each names the problem and, where there is one, the fix."""


class PulsarAutoscaleError(Exception):
    """Base class; the CLI prints these without a traceback."""


class ConfigError(PulsarAutoscaleError):
    """A configuration value is missing or invalid."""


class BrokerError(PulsarAutoscaleError):
    """The broker could not be started or reached."""


class Forbidden(PulsarAutoscaleError):
    """The caller's role may not do this (HTTP 403)."""

    http_status = 403
