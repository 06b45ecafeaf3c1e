"""Pulsar's JWT tokens: keys in Pulsar's formats, tokens as `bin/pulsar tokens create` makes them,
validation as Pulsar's AuthenticationProviderToken does it.

Key formats are Pulsar's (AuthTokenUtils): a secret key is the raw key bytes; a key pair is a
PKCS#8 DER private key and an X.509 (SubjectPublicKeyInfo) DER public key. A key is given as
Pulsar's broker.conf gives it: ``file:///path``, ``data:;base64,...``, ``env:VAR`` (base64), a
path, or the base64 text itself. PEM files are accepted too (PyJWT and openssl make them).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import time
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote, urlsplit

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from pulsar_autoscale.errors import ConfigError

SECRET_ALGORITHMS = ("HS256", "HS384", "HS512")
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS: dict[str, type[ec.EllipticCurve]] = {"ES256": ec.SECP256R1, "ES384": ec.SECP384R1, "ES512": ec.SECP521R1}
PAIR_ALGORITHMS = RSA_ALGORITHMS + tuple(EC_ALGORITHMS)
# JJWT's Keys.secretKeyFor: the key is as long as the hash
SECRET_KEY_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
RSA_KEY_BITS = 2048
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdwy]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


class InvalidToken(Exception):
    """A token that does not authenticate; the message names why, never the token."""


def read_key(spec: str) -> bytes:
    """Key bytes from a Pulsar key setting (tokenSecretKey / tokenPublicKey / --secret-key ...)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("a key must be given as file:///path, data:;base64,..., env:VAR, a path or base64 text")
    spec = spec.strip()
    if spec.startswith("data:"):
        header, sep, data = spec.partition(",")
        if not sep:
            raise ConfigError("a data: key must be data:[<mediatype>][;base64],<data>")
        return _b64(data, "the data: key") if header.endswith(";base64") else unquote(data).encode()
    if spec.startswith("env:"):
        name = spec[len("env:") :]
        if name not in os.environ:
            raise ConfigError(f"environment variable {name} (key setting env:{name}) is not set")
        return _b64(os.environ[name], f"environment variable {name}")
    if spec.startswith("file:"):
        path = unquote(urlsplit(spec).path) if spec.startswith("file://") else spec[len("file:") :]
        return _read_file(path)
    if os.path.exists(spec):
        return _read_file(spec)
    try:
        return base64.b64decode(spec, validate=True)
    except binascii.Error:
        raise ConfigError(
            "key file does not exist and the setting is not base64 key text (use file:///path or data:;base64,...)"
        ) from None


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except binascii.Error:
        raise ConfigError(f"{what} is not valid base64") from None


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read key file {path}: {exc.strerror}") from None
    if not data:
        raise ConfigError(f"key file {path} is empty")
    return data


# ---- keys ------------------------------------------------------------------------------------------------
def create_secret_key(algorithm: str = "HS256") -> bytes:
    if algorithm not in SECRET_KEY_BYTES:
        raise ConfigError(f"secret keys are for {', '.join(SECRET_ALGORITHMS)}, not {algorithm}")
    return os.urandom(SECRET_KEY_BYTES[algorithm])


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """(private key PKCS#8 DER, public key X.509 DER), the files Pulsar's create-key-pair writes."""
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm in RSA_ALGORITHMS:
        private = rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_BITS)
    elif algorithm in EC_ALGORITHMS:
        private = ec.generate_private_key(EC_ALGORITHMS[algorithm]())
    else:
        raise ConfigError(f"key pairs are for {', '.join(PAIR_ALGORITHMS)}, not {algorithm}")
    der = serialization.Encoding.DER
    return (
        private.private_bytes(der, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        private.public_key().public_bytes(der, serialization.PublicFormat.SubjectPublicKeyInfo),
    )


def load_private_key(data: bytes):
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_private_key(data, password=None)
        return serialization.load_der_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a private key (PKCS#8 DER or PEM): {exc}") from None


def load_public_key(data: bytes):
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_public_key(data)
        return serialization.load_der_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a public key (X.509 DER or PEM): {exc}") from None


def _pair_algorithms(key) -> tuple[str, ...]:
    if isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        return RSA_ALGORITHMS
    if isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
        return tuple(EC_ALGORITHMS)
    raise ConfigError(f"{type(key).__name__} keys are not supported: use RSA or EC keys")


# ---- tokens ----------------------------------------------------------------------------------------------
def parse_duration(text: str) -> int:
    """Pulsar's relative times for --expiry-time: 30s, 10m, 12h, 7d, 2w, 1y (a bare number is seconds)."""
    m = _DURATION.match(str(text))
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(f"expiry time {text!r} must be a positive number with a unit s, m, h, d, w or y (e.g. 1y)")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def create_token(
    subject: str,
    *,
    secret_key: bytes | None = None,
    private_key: bytes | None = None,
    algorithm: str | None = None,
    expires_in_s: int | None = None,
    now: float | None = None,
) -> str:
    """A token as Pulsar's AuthTokenUtils.createToken makes it: header {"alg"}, claims {"sub"[, "exp"]}."""
    if not subject:
        raise ConfigError("a token needs a subject (the role)")
    if (secret_key is None) == (private_key is None):
        raise ConfigError("give exactly one of a secret key and a private key")
    claims: dict = {"sub": subject}
    if expires_in_s is not None:
        claims["exp"] = int((time.time() if now is None else now) + expires_in_s)
    if secret_key is not None:
        algorithm = algorithm or "HS256"
        if algorithm not in SECRET_ALGORITHMS:
            raise ConfigError(f"a secret key signs {', '.join(SECRET_ALGORITHMS)}, not {algorithm}")
        key = secret_key
    else:
        key = load_private_key(cast(bytes, private_key))  # not None: exactly one key is given
        algorithm = algorithm or _pair_algorithms(key)[0]
        if algorithm not in _pair_algorithms(key):
            raise ConfigError(f"a {type(key).__name__} cannot sign {algorithm}")
    return jwt.encode(claims, key, algorithm=algorithm, headers={"typ": None})


def decode_unverified(token: str) -> tuple[dict, dict]:
    """(header, claims) without checking the signature: what `tokens show` prints."""
    try:
        return jwt.get_unverified_header(token), jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise ConfigError(f"not a JWT: {exc}") from None


@dataclass(frozen=True)
class TokenValidator:
    """Validates tokens with a secret key (HS*) or a public key (RS*/PS*/ES*), as Pulsar's broker does:
    the signature, `exp`/`nbf` when present, the audience when configured; the role is `role_claim`."""

    key: bytes | rsa.RSAPublicKey | ec.EllipticCurvePublicKey
    algorithms: tuple[str, ...]
    role_claim: str = "sub"  # Pulsar's tokenAuthClaim
    audience: str | None = None  # Pulsar's tokenAudience: required in ...
    audience_claim: str = "aud"  # ... this claim (tokenAudienceClaim)

    def __repr__(self) -> str:
        return f"TokenValidator(algorithms={self.algorithms}, role_claim={self.role_claim!r})"

    @classmethod
    def from_settings(
        cls,
        secret_key: str | None = None,
        public_key: str | None = None,
        public_alg: str | None = None,
        role_claim: str = "sub",
        audience: str | None = None,
        audience_claim: str = "aud",
    ) -> "TokenValidator":
        if (secret_key is None) == (public_key is None):
            raise ConfigError("token authentication needs exactly one of a secret key and a public key")
        algorithms: tuple[str, ...]
        if secret_key is not None:
            key, algorithms = read_key(secret_key), SECRET_ALGORITHMS
        else:
            key = load_public_key(read_key(cast(str, public_key)))  # not None: exactly one key is given
            algorithms = _pair_algorithms(key)
            if public_alg:
                if public_alg not in algorithms:
                    raise ConfigError(f"token public algorithm {public_alg} does not fit a {type(key).__name__}")
                algorithms = (public_alg,)
        return cls(key, algorithms, role_claim, audience, audience_claim)

    def role(self, token: str) -> str:
        try:
            claims = jwt.decode(token, self.key, algorithms=list(self.algorithms), options={"verify_aud": False, "require": []})
        except jwt.ExpiredSignatureError:
            raise InvalidToken("the token has expired") from None
        except jwt.InvalidSignatureError:
            raise InvalidToken("the token's signature does not verify") from None
        except jwt.InvalidAlgorithmError:
            raise InvalidToken(f"the token is not signed with {'/'.join(self.algorithms)}") from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"the token is not valid: {type(exc).__name__}") from None
        if self.audience is not None:
            aud = claims.get(self.audience_claim)
            if self.audience not in (aud if isinstance(aud, list) else [aud]):
                raise InvalidToken("the token is not for this audience")
        role = claims.get(self.role_claim)
        if isinstance(role, list) and role:
            role = role[0]
        if not isinstance(role, str) or not role:
            raise InvalidToken(f"the token has no role in its {self.role_claim!r} claim")
        return role


def describe(token: str) -> str:
    header, claims = decode_unverified(token)
    return json.dumps(header, sort_keys=True) + "\n" + json.dumps(claims, sort_keys=True)
