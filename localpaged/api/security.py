"""API-key and login configuration, and the bind-address safety rule: a non-loopback bind needs
a login (a password or the API key) unless the user passes the explicit open flag."""

from __future__ import annotations

import logging
import os

from localpaged.api.guard import is_loopback

logger = logging.getLogger(__name__)

API_KEY_ENV = "LOCALPAGED_API_KEY"
PASSWORD_ENV = "LOCALPAGED_PASSWORD"
OPEN_FLAG = "--no-login-i-know-this-is-public"

__all__ = ["API_KEY_ENV", "PASSWORD_ENV", "OPEN_FLAG", "is_loopback", "resolve_api_key",
           "resolve_password", "check_bind_safety", "login_secrets", "require_login_for_bind"]


def _resolve(cli_value: str | None, env: str) -> str | None:
    value = cli_value if cli_value is not None else os.environ.get(env)
    return value.strip() or None if value else None


def resolve_api_key(cli_value: str | None = None) -> str | None:
    """The API key: `--api-key` when given, else $LOCALPAGED_API_KEY, else None (no auth)."""
    return _resolve(cli_value, API_KEY_ENV)


def resolve_password(cli_value: str | None = None) -> str | None:
    """The login password: `--password` when given, else $LOCALPAGED_PASSWORD, else None."""
    return _resolve(cli_value, PASSWORD_ENV)


def check_bind_safety(host: str, api_key: str | None) -> bool:
    """Warn when serving on a non-loopback address without an API key; True when safe."""
    if api_key or is_loopback(host):
        return True
    logger.warning("serving on %s without an API key: anyone who can reach this address can use "
                   "the model. Set --api-key or %s, or bind 127.0.0.1.", host, API_KEY_ENV)
    return False


def login_secrets(host: str, password: str | None, api_key: str | None) -> list[str]:
    """What logs a request in on every route: the password when set; the API key too when a
    password is set or the bind is not loopback (on loopback with a key alone, only /v1 asks for
    the key, and the UI stays open to this machine)."""
    secrets = [password] if password else []
    if api_key and (password or not is_loopback(host)):
        secrets.append(api_key)
    return secrets


def require_login_for_bind(host: str, secrets: list[str | None], open_ok: bool = False) -> None:
    """Raise ValueError when `host` is not loopback, no login secret is set and the user did not
    pass the open flag; with the flag, warn loudly instead."""
    if is_loopback(host) or any(secrets):
        return
    if not open_ok:
        raise ValueError(f"refusing to serve on {host} without a login: set --password (or "
                         f"${PASSWORD_ENV}) or --api-key, bind 127.0.0.1, or pass {OPEN_FLAG} "
                         "to serve every conversation and the model to anyone on the network")
    logger.warning("serving on %s with NO LOGIN (%s): anyone who can reach this address can "
                   "read and write your conversations and use the model", host, OPEN_FLAG)
