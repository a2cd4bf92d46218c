"""CORS: which pages of other origins a browser lets talk to the server (vLLM's ``--allowed-origins``,
``--allow-credentials``, ``--allowed-methods``, ``--allowed-headers``).

vLLM's server runs Starlette's CORSMiddleware; a page that works against vLLM must work here, so
these are its semantics:

- A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is answered at
  once, before routing and before the API-key check (browsers send no credentials on a
  preflight): 200 with the ``Access-Control-Allow-*`` headers when the origin, the method and every
  requested header are allowed, else 400 ``Disallowed CORS origin, method, ...``. A preflight that
  asks for private-network access (Chrome's ``Access-Control-Request-Private-Network``, a public
  page reaching a local server) is refused, as Starlette refuses it unless told otherwise, which
  vLLM never does.
- Any other response to a request with an ``Origin``: ``Access-Control-Allow-Origin: *`` when
  every origin is allowed and credentials are not; the request's own origin when credentials are
  allowed (browsers refuse ``*`` with credentials) or when it is one of the listed origins; none for
  an origin not allowed, which the browser then keeps from the page. ``Vary: Origin`` tells caches
  that the answer depends on the origin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from quart import Quart, Response, request

from aioinfer.server_config import ServerConfig

ALL_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
# Request headers a page may send without asking (the Fetch standard's CORS-safelisted ones).
SAFELISTED_HEADERS = ("Accept", "Accept-Language", "Content-Language", "Content-Type")
MAX_AGE_SECONDS = 600  # how long a browser may reuse a preflight's answer
PREFLIGHT_VARY = "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"
_ANSWERED = "aioinfer.cors_preflight"  # request.scope key: this response is the preflight's own


@dataclass(frozen=True, slots=True)
class CORSPolicy:
    origins: frozenset[str]  # listed origins ("scheme://host[:port]"), unused when any_origin
    any_origin: bool  # "*" was listed
    credentials: bool  # pages may send cookies / Authorization: the origin is echoed instead of "*"
    methods: tuple[str, ...]  # upper-case; every method when "*" was listed
    headers: tuple[str, ...]  # allowed request headers, safelisted ones included; unused when any_header
    any_header: bool  # "*": a preflight gets back exactly the headers it asked for

    @classmethod
    def from_config(cls, config: ServerConfig) -> Optional["CORSPolicy"]:
        """The server's policy; None when no origin is allowed (nothing to answer or add)."""
        if not config.allowed_origins:
            return None
        methods = (ALL_METHODS if "*" in config.allowed_methods
                   else tuple(dict.fromkeys(m.upper() for m in config.allowed_methods)))
        headers = tuple(dict.fromkeys([*SAFELISTED_HEADERS, *config.allowed_headers]))
        return cls(origins=frozenset(config.allowed_origins), any_origin="*" in config.allowed_origins,
                   credentials=config.allow_credentials, methods=methods, headers=headers,
                   any_header="*" in config.allowed_headers)

    def allows_origin(self, origin: str) -> bool:
        return self.any_origin or origin in self.origins

    def preflight(self, origin: str, method: str, requested_headers: Optional[str],
                  private_network: bool) -> tuple[int, str, dict[str, str]]:
        """(status, body, headers) of the answer to a preflight."""
        headers = {"Vary": PREFLIGHT_VARY, "Access-Control-Allow-Methods": ", ".join(self.methods),
                   "Access-Control-Max-Age": str(MAX_AGE_SECONDS)}
        refused = []
        if not self.allows_origin(origin):
            refused.append("origin")
        elif self.any_origin and not self.credentials:
            headers["Access-Control-Allow-Origin"] = "*"
        else:
            headers["Access-Control-Allow-Origin"] = origin
        if method not in self.methods:
            refused.append("method")
        if self.any_header:
            if requested_headers is not None:
                headers["Access-Control-Allow-Headers"] = requested_headers
        else:
            headers["Access-Control-Allow-Headers"] = ", ".join(self.headers)
            allowed = {h.lower() for h in self.headers}
            if requested_headers is not None and any(
                    h.strip().lower() not in allowed for h in requested_headers.split(",") if h.strip()):
                refused.append("headers")
        if private_network:
            refused.append("private-network")
        if self.credentials:
            headers["Access-Control-Allow-Credentials"] = "true"
        if refused:
            return 400, "Disallowed CORS " + ", ".join(refused), headers
        return 200, "OK", headers

    def response_headers(self, origin: Optional[str]) -> dict[str, str]:
        """Headers to set on any other response (``Vary`` is added to, not replaced: see install_cors)."""
        if origin is None or not self.allows_origin(origin):
            return {"Vary": "Origin"}
        if self.any_origin and not self.credentials:
            return {"Access-Control-Allow-Origin": "*", "Vary": "Origin"}
        headers = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if self.credentials:
            headers["Access-Control-Allow-Credentials"] = "true"
        return headers


def install_cors(app: Quart, policy: Optional[CORSPolicy]) -> None:
    """Answer preflights and add the CORS headers to every response (nothing when ``policy`` is None).

    Call it before registering the API-key check: before-request hooks run in registration order,
    and a preflight must be answered without credentials.
    """
    if policy is None:
        return

    @app.before_request
    async def _cors_preflight():
        headers = request.headers
        origin, method = headers.get("Origin"), headers.get("Access-Control-Request-Method")
        if request.method != "OPTIONS" or origin is None or method is None:
            return None
        status, body, answer = policy.preflight(origin, method, headers.get("Access-Control-Request-Headers"),
                                                "Access-Control-Request-Private-Network" in headers)
        request.scope[_ANSWERED] = True
        return Response(body, status=status, headers=answer, content_type="text/plain; charset=utf-8")

    @app.after_request
    async def _cors_headers(response):
        if request.scope.get(_ANSWERED):
            return response
        for name, value in policy.response_headers(request.headers.get("Origin")).items():
            if name == "Vary":
                present = response.headers.get("Vary")
                value = value if not present else f"{present}, {value}"
            response.headers[name] = value
        return response
