"""API keys and per-key concurrency (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmesh.runtime.bearer import bearer_token, matching_key

from .errors import ApiError


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """The accepted keys; an empty set means no authentication."""

    keys: frozenset[str] = frozenset()

    def check(self, authorization: str | None) -> str:
        """The caller's key from `Authorization: Bearer <key>`, or a 401. "" when auth is off."""
        if not self.keys:
            return ""
        token = bearer_token(authorization)
        if not token:
            raise ApiError(
                401,
                "You didn't provide an API key. You need to provide your API key in an Authorization header "
                "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                code="invalid_api_key",
            )
        key = matching_key(token, self.keys)
        if key is None:
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return key


@dataclass(slots=True)
class KeyLimiter:
    """At most `limit` in-flight generations per key (0 = unlimited)."""

    limit: int = 0
    inflight: dict[str, int] = field(default_factory=dict)

    def acquire(self, key: str) -> None:
        count = self.inflight.get(key, 0)
        if self.limit and count >= self.limit:
            raise ApiError(
                429,
                f"Too many concurrent requests for this API key: at most {self.limit} may be in flight.",
                code="concurrency_limit_exceeded",
                retry_after_s=1.0,
            )
        self.inflight[key] = count + 1

    def release(self, key: str) -> None:
        count = self.inflight.get(key, 0) - 1
        if count > 0:
            self.inflight[key] = count
        else:
            self.inflight.pop(key, None)
