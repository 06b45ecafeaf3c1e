"""`pulsar-autoscale tokens ...`: Pulsar's `bin/pulsar tokens` (same subcommands, flags and key files)."""

from __future__ import annotations

import argparse
import base64
import os
import sys

from pulsar_autoscale.errors import ConfigError

from . import tokens

ACTIONS = {
    "create-secret-key": "create a secret key (HS256) for signing and validating tokens",
    "create-key-pair": "create a private/public key pair (RS256, ES256, ...)",
    "create": "create a token for a role (--subject)",
    "show": "print a token's header and claims (without validating it)",
    "validate": "validate a token with the secret or public key; print its role",
}


def configure_parser(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, help_text in ACTIONS.items():
        a = sub.add_parser(action, help=help_text, description=help_text)
        if action == "create-secret-key":
            a.add_argument("-a", "--signature-algorithm", default="HS256", choices=tokens.SECRET_ALGORITHMS)
            a.add_argument("-o", "--output", default=None, help="key file to write (default: stdout)")
            a.add_argument("-b", "--base64", action="store_true", help="write the key base64-encoded")
        elif action == "create-key-pair":
            a.add_argument("-a", "--signature-algorithm", default="RS256", choices=tokens.PAIR_ALGORITHMS)
            a.add_argument("--output-private-key", required=True, help="private key file (PKCS#8 DER)")
            a.add_argument("--output-public-key", required=True, help="public key file (X.509 DER)")
        elif action == "create":
            a.add_argument("-s", "--subject", required=True, help="the role the token authenticates")
            a.add_argument("-e", "--expiry-time", default=None, help="e.g. 30m, 12h, 7d, 1y (default: never)")
            a.add_argument(
                "-a",
                "--signature-algorithm",
                default=None,
                help="default HS256 with a secret key, RS256/ES256 with a private key",
            )
            _key_flags(a, "-sk", "--secret-key", "-pk", "--private-key", "signs")
        else:
            a.add_argument("token", nargs="?", default=None, help="the token")
            a.add_argument("-i", "--stdin", action="store_true", help="read the token from stdin")
            a.add_argument("-f", "--token-file", default=None, help="read the token from a file")
            if action == "validate":
                _key_flags(a, "-sk", "--secret-key", "-pk", "--public-key", "validates")


def _key_flags(a: argparse.ArgumentParser, s_short: str, s_long: str, k_short: str, k_long: str, verb: str) -> None:
    keys = a.add_mutually_exclusive_group(required=True)
    keys.add_argument(s_short, s_long, default=None, help=f"secret key that {verb}: file:///path, data:;base64,...")
    keys.add_argument(k_short, k_long, default=None, help=f"key that {verb}: file:///path, data:;base64,...")


def _write(path: str | None, data: bytes) -> None:
    if path is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # a key: readable by its owner only
    os.fchmod(fd, 0o600)  # the mode above applies only to a new file: an existing one keeps its own otherwise
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _read_token(args) -> str:
    if args.stdin:
        token = sys.stdin.read()
    elif args.token_file:
        try:
            with open(args.token_file) as fh:
                token = fh.read()
        except OSError as exc:
            raise ConfigError(f"cannot read token file {args.token_file}: {exc.strerror}") from None
    else:
        token = args.token or ""
    if not token.strip():
        raise ConfigError("give the token as an argument, with -i (stdin) or with -f FILE")
    return token.strip()


def run(args: argparse.Namespace) -> int:
    if args.action == "create-secret-key":
        key = tokens.create_secret_key(args.signature_algorithm)
        _write(args.output, base64.b64encode(key) if args.base64 else key)
    elif args.action == "create-key-pair":
        private, public = tokens.create_key_pair(args.signature_algorithm)
        _write(args.output_private_key, private)
        _write(args.output_public_key, public)
    elif args.action == "create":
        expiry = tokens.parse_duration(args.expiry_time) if args.expiry_time else None
        key = tokens.read_key(args.secret_key or args.private_key)
        print(
            tokens.create_token(
                args.subject,
                secret_key=key if args.secret_key else None,
                private_key=None if args.secret_key else key,
                algorithm=args.signature_algorithm,
                expires_in_s=expiry,
            )
        )
    elif args.action == "show":
        print(tokens.describe(_read_token(args)))
    else:
        validator = tokens.TokenValidator.from_settings(args.secret_key, args.public_key)
        try:
            print(validator.role(_read_token(args)))
        except tokens.InvalidToken as exc:
            raise ConfigError(f"invalid token: {exc}") from None
    return 0
