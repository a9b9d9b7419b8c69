"""--api-key: every /v1 route needs `Authorization: Bearer <key>`, as vLLM's AuthenticationMiddleware asks.

A wrong or missing key gets a 401 in OpenAI's error shape (code "invalid_api_key") before the body is read.
/health, /metrics, /version, /tokenize and /detokenize stay open, as in vLLM (which checks paths starting
with /v1 only); so do CORS preflights (OPTIONS). Keys are compared as SHA-256 digests in constant time.
"""
from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from .protocol import error_body


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class APIKeyAuth:
    """ASGI middleware: refuse /v1 requests whose bearer token is not api_key; on_refused() per refusal."""

    def __init__(self, app, api_key: str, on_refused=None):
        if not isinstance(api_key, str) or not api_key:
            raise ValueError("api_key must be a non-empty string")
        self.app, self._key, self.on_refused = app, _digest(api_key), on_refused

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or not scope["path"].startswith("/v1"):
            return await self.app(scope, receive, send)
        scheme, _, token = (Headers(scope=scope).get("authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(_digest(token.strip()), self._key):
            return await self.app(scope, receive, send)
        if self.on_refused is not None:
            self.on_refused()
        body = error_body("Incorrect API key provided: send the server's key as `Authorization: Bearer <key>`",
                          "invalid_request_error", code="invalid_api_key")
        await JSONResponse(body, status_code=401, headers={"www-authenticate": "Bearer"})(scope, receive, send)
