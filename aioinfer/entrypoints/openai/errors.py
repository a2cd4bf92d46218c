"""HTTP errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a route can meet is turned into an ``APIError`` here, in one place, so that the
status code of each exception type is decided once (typed exceptions inside, the API's error JSON at the edge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pydantic import ValidationError

from aioinfer.core.scheduler import RequestTooLongError
from aioinfer.errors import (
    AdmissionLimitExceeded,
    EngineDeadError,
    EngineNotReady,
    EngineOverloaded,
    RequestDeadlineExceeded,
    SlowConsumerError,
)
from aioinfer.structured_output.limits import ConstraintLimitError


@dataclass(slots=True)
class APIError(Exception):
    status: int  # HTTP status code
    message: str
    type: str = "invalid_request_error"  # OpenAI's error type
    param: Optional[str] = None  # the request field at fault, when there is one
    code: Optional[str] = None  # a stable machine-readable code
    retry_after: Optional[float] = None  # seconds, sent as Retry-After (429, 503)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


def bad_request(message: str, param: Optional[str] = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")


def unauthorized() -> APIError:
    return APIError(401, "Invalid or missing API key: send it as 'Authorization: Bearer <key>'.",
                    type="authentication_error", code="invalid_api_key")


def request_too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than the limit of {limit} bytes.", code="request_too_large")


def request_timeout(seconds: Optional[float]) -> APIError:
    within = f" within {seconds:g} seconds" if seconds is not None else ""
    return APIError(408, f"The request body was not received{within}.", type="timeout", code="request_timeout")


def unsupported_media_type(content_type: Optional[str]) -> APIError:
    got = f"got {content_type!r}" if content_type else "no Content-Type header"
    return APIError(415, f"Unsupported Media Type: only 'application/json' is allowed ({got}).",
                    code="unsupported_media_type")


def shutting_down(message: str = "The server is shutting down.") -> APIError:
    return APIError(503, message, type="service_unavailable", code="shutting_down")


def not_ready() -> APIError:
    return APIError(503, "The model is still loading; retry later.", type="service_unavailable",
                    code="not_ready", retry_after=5.0)


def from_validation_error(exc: ValidationError) -> APIError:
    """The first pydantic error, phrased for the API user, naming the field."""
    errors = exc.errors(include_url=False)
    # Of a union's failed branches, the deepest error is the telling one ("type should be 'text'",
    # not "content should be a string"); max() keeps the first of equals.
    err = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = [str(p) for p in err.get("loc", ()) if not _is_union_branch(p)]
    param = ".".join(loc) or None
    kind = err.get("type", "")
    if kind == "json_invalid":
        return bad_request(f"Malformed JSON body: {err.get('msg')}", code="invalid_json")
    if kind == "model_type" and not loc:
        return bad_request("The request body must be a JSON object.", code="invalid_json")
    if kind == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {param}", param=param,
                           code="unknown_parameter")
    if kind == "missing":
        return bad_request(f"Missing required parameter: {param}", param=param, code="missing_required_parameter")
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return bad_request(f"Invalid value for {param}: {msg}" if param else msg, param=param)


def _is_union_branch(part: object) -> bool:
    # pydantic puts the union branch tried into the location ("prompt.str", "list[int]", ...).
    text = str(part)
    return text in ("str", "int", "float", "bool") or "[" in text or text.startswith("function-")


def from_engine_error(exc: BaseException) -> APIError:
    """Map what ``Engine.generate`` (or its stream) raised to an HTTP error."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineOverloaded):
        return APIError(429, str(exc), type="rate_limit_error", code="engine_overloaded",
                        retry_after=max(1.0, float(exc.retry_after)))
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc), type="service_unavailable", code="engine_dead")
    if isinstance(exc, EngineNotReady):
        return APIError(503, str(exc), type="service_unavailable", code="not_ready", retry_after=5.0)
    if isinstance(exc, RequestDeadlineExceeded):
        return APIError(504, str(exc), type="timeout", code="deadline_exceeded")
    if isinstance(exc, SlowConsumerError):
        return APIError(408, str(exc), type="timeout", code="slow_consumer")
    if isinstance(exc, AdmissionLimitExceeded):  # before ValueError: it is one, with its own code
        return bad_request(str(exc), param="n" if exc.bound == "max_waiting_requests" else None,
                           code="admission_limit_exceeded")
    if isinstance(exc, ConstraintLimitError):  # a ValueError too: a limit of the server's, named in the message
        return bad_request(str(exc), code="constraint_limit_exceeded")
    if isinstance(exc, ValueError):
        message = str(exc)
        is_length = isinstance(exc, RequestTooLongError) or "maximum context length" in message
        return bad_request(message, code="context_length_exceeded" if is_length else "invalid_value")
    return APIError(500, f"Internal error: {type(exc).__name__}", type="server_error", code="internal_error")
