"""Token authentication and authorization for an Apache Pulsar standalone: the keys an ApacheStandalone
writes into its broker's standalone.conf and its functions worker's functions_worker.yml when tokens are
required, and the broker's own credential that goes with them."""

from __future__ import annotations

from dataclasses import dataclass

from pulsar_autoscale.errors import BrokerError

TOKEN_PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
TOKEN_CLIENT_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


@dataclass(frozen=True)
class TokenAuth:
    """Token authentication and authorization for a standalone, as Pulsar's security docs set it up.

    The key is a Pulsar key setting (file:///path, data:;base64,...), e.g. from `pulsar-autoscale tokens
    create-secret-key`; `broker_token` is the broker's own client credential (its internal admin client, the
    functions worker and the function instances it spawns use it), so its subject must be a superuser."""

    broker_token: str
    superusers: tuple[str, ...]
    secret_key: str | None = None  # tokenSecretKey (HS256/384/512)
    public_key: str | None = None  # tokenPublicKey (RS256, ES256, ...)

    def __post_init__(self) -> None:
        if (self.secret_key is None) == (self.public_key is None):
            raise BrokerError("TokenAuth needs exactly one of secret_key and public_key")
        if not self.superusers:
            raise BrokerError("TokenAuth needs a superuser role (the broker's own token is one)")

    def __repr__(self) -> str:  # the broker token is a credential: never in logs or errors
        return f"TokenAuth(superusers={self.superusers!r}, broker_token=***)"

    def broker_properties(self) -> dict[str, object]:
        """standalone.conf keys; the standalone copies them into its functions worker's config as well."""
        key = {"tokenSecretKey": self.secret_key} if self.secret_key else {"tokenPublicKey": self.public_key}
        return {
            "authenticationEnabled": "true",
            "authenticationProviders": TOKEN_PROVIDER,
            "authorizationEnabled": "true",
            "superUserRoles": ",".join(self.superusers),
            "brokerClientAuthenticationPlugin": TOKEN_CLIENT_PLUGIN,
            "brokerClientAuthenticationParameters": f"token:{self.broker_token}",
            **key,
        }

    def worker_settings(self) -> dict[str, object]:
        """functions_worker.yml keys, for a worker that reads its file rather than the broker's config."""
        props = self.broker_properties()
        return {
            "authenticationEnabled": True,
            "authorizationEnabled": True,
            "authenticationProviders": [TOKEN_PROVIDER],
            "superUserRoles": list(self.superusers),
            "brokerClientAuthenticationEnabled": True,
            "brokerClientAuthenticationPlugin": TOKEN_CLIENT_PLUGIN,
            "brokerClientAuthenticationParameters": props["brokerClientAuthenticationParameters"],
            "clientAuthenticationPlugin": TOKEN_CLIENT_PLUGIN,
            "clientAuthenticationParameters": props["brokerClientAuthenticationParameters"],
            "properties": {k: v for k, v in props.items() if k.startswith("token")},
        }
