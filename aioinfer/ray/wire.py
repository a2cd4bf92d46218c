"""What crosses between the ingress and an engine replica besides deltas: admission and error messages.

An exception raised on a replica cannot simply be pickled across: several of aioinfer's carry fields
their constructor takes as arguments (``EngineOverloaded.retry_after``, ``AdmissionLimitExceeded``'s
bound), which pickling drops, and the HTTP status the ingress answers with depends on the exact class
(``errors.from_engine_error``). So the replica names the error's kind and sends its fields, and the
ingress rebuilds the same exception; a 400, a 429 with its Retry-After or a 503 then reads exactly as
the single-process server's.

Messages are plain tuples (cheap to pickle, no class to keep in step across versions):

- ``(ADMITTED, replica_id)``: the first item of a stream whose request the replica's engine admitted;
- ``(ERROR, kind, message, fields)``: the first item of a refused request, or the last of a failed one;
- ``(FINAL, delta, request_stats)``: the last delta of a request, with the engine's record of it
  (``RequestStats`` or None), so that the ingress's metrics observe the replica's own timings.

Every other item of a stream is a ``GenerationDelta``.
"""

from __future__ import annotations

from typing import Any

from aioinfer.core.scheduler import RequestTooLongError
from aioinfer.errors import (AdmissionLimitExceeded, EngineDeadError, EngineNotReady, EngineOverloaded,
                             RequestDeadlineExceeded, SlowConsumerError)
from aioinfer.structured_output.limits import ConstraintLimitError

ADMITTED = "admitted"
ERROR = "error"
FINAL = "final"

# (kind, class), most specific first: an error takes the first kind it is an instance of.
_KINDS: tuple[tuple[str, type], ...] = (
    ("overloaded", EngineOverloaded),
    ("admission_limit", AdmissionLimitExceeded),
    ("too_long", RequestTooLongError),
    ("constraint_limit", ConstraintLimitError),
    ("invalid", ValueError),
    ("dead", EngineDeadError),
    ("not_ready", EngineNotReady),
    ("slow_consumer", SlowConsumerError),
    ("deadline", RequestDeadlineExceeded),
)


def error_message(exc: BaseException) -> tuple[str, str, str, Any]:
    """``(ERROR, kind, message, fields)`` for ``exc``; an error of no known kind is "internal"."""
    kind = next((name for name, cls in _KINDS if isinstance(exc, cls)), "internal")
    fields: Any = None
    if kind == "overloaded":
        fields = float(exc.retry_after)
    elif kind == "admission_limit":
        fields = (exc.bound, exc.limit, exc.needed)
    message = str(exc) if kind != "internal" else f"{type(exc).__name__}: {exc}"
    return (ERROR, kind, message, fields)


def error_of(message: tuple) -> BaseException:
    """The exception an ``(ERROR, kind, message, fields)`` message stands for, as the engine raised it."""
    _, kind, text, fields = message
    if kind == "overloaded":
        return EngineOverloaded(text, retry_after=fields)
    if kind == "admission_limit":
        bound, limit, needed = fields
        return AdmissionLimitExceeded(text, bound, limit, needed)
    cls = {name: cls for name, cls in _KINDS}.get(kind)
    if cls is None:
        return RuntimeError(f"an engine replica failed: {text}")  # "internal": the server's 500
    return cls(text)
