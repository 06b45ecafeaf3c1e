"""What the worker answers when an action cannot be done; the REST layer maps each to its status code."""

from pulsar_autoscale.errors import PulsarAutoscaleError


class NotFound(PulsarAutoscaleError):
    """No such function (REST: 404)."""


class Conflict(PulsarAutoscaleError):
    """The function exists already (REST: 400, as Pulsar answers)."""


class StaleEpoch(PulsarAutoscaleError):
    """An action from a deposed controller leader (REST: 409)."""


class BrokerUnavailable(PulsarAutoscaleError):
    """The worker has not reached its broker yet (REST: 503)."""
