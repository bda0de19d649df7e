"""Bearer keys (`Authorization: Bearer <key>`), shared by every service that checks one."""

from __future__ import annotations

import hmac
from collections.abc import Iterable


def bearer_token(authorization: str | None) -> str:
    """The key of an `Authorization: Bearer <key>` header; "" when there is none."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def matching_key(token: str, keys: Iterable[str]) -> str | None:
    """The key equal to `token`, compared against every key in constant time so timing reveals nothing."""
    matched = [k for k in keys if hmac.compare_digest(k.encode(), token.encode())]
    return matched[0] if matched else None
