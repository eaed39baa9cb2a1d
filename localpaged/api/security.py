"""API-key configuration and the bind-address safety check."""

from __future__ import annotations

import ipaddress
import logging
import os

logger = logging.getLogger(__name__)

API_KEY_ENV = "LOCALPAGED_API_KEY"


def resolve_api_key(cli_value: str | None = None) -> str | None:
    """The API key: `--api-key` when given, else $LOCALPAGED_API_KEY, else None (no auth)."""
    key = cli_value if cli_value is not None else os.environ.get(API_KEY_ENV)
    return key.strip() or None if key else None


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False                 # a hostname: it may resolve to a public interface


def check_bind_safety(host: str, api_key: str | None) -> bool:
    """Warn when serving on a non-loopback address without an API key; True when safe."""
    if api_key or is_loopback(host):
        return True
    logger.warning("serving on %s without an API key: anyone who can reach this address can use "
                   "the model. Set --api-key or %s, or bind 127.0.0.1.", host, API_KEY_ENV)
    return False
