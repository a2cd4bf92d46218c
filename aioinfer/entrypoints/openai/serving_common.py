"""Pieces shared by the completions and chat routes: parsing, ids, per-choice accumulation, usage."""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional, TypeVar

from pydantic import BaseModel, ValidationError

from aioinfer.engine.delta import GenerationDelta
from aioinfer.entrypoints.openai.client_stall import probe_for
from aioinfer.entrypoints.openai.errors import bad_request, from_engine_error, from_validation_error, shutting_down
from aioinfer.entrypoints.openai.protocol import describe_fields, ignored_fields, unsupported_field
from aioinfer.entrypoints.openai.shutdown import slot_of

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def engine_for(state, req, num_prompts: int = 1):
    """The preamble every generation route shares: known model, ready engine, ``n`` within bounds,
    and room for ``num_prompts`` x n engine requests, checked before any prompt is tokenized (every
    prompt has a token at least): a request too large for the admission bounds costs no
    tokenization either. The exact check, with the prompts' lengths, comes at admission."""
    state.check_model(req.model)
    engine = state.ready_engine()
    if req.n > state.config.max_n:
        raise bad_request(f"n must be <= {state.config.max_n}", param="n")
    check = getattr(engine, "check_admission", None)
    if check is not None:
        try:
            check([1] * (num_prompts * req.n))
        except Exception as exc:  # noqa: BLE001 - never (400) / not now (429)
            raise from_engine_error(exc) from exc
    return engine


async def admit_and_respond(engine, specs, request_id: str, req, job):
    """Admit every choice (errors -> 400/429/503 before anything is sent), then stream or answer."""
    from aioinfer.entrypoints.openai.fanout import ChoiceStreams
    from aioinfer.entrypoints.openai.sse import json_response, sse_response

    scope = _request_scope()
    slot = slot_of(scope)
    if slot is not None and slot.cancelled:
        raise shutting_down()
    # A stream's client can stop reading while the kernel still buffers megabytes for it: the
    # engine's stall limit also watches the connection itself (client_stall.py).
    stall_probe = probe_for(scope) if req.stream else None
    headers = {"X-Request-Id": request_id, **ignored_header(req)}  # before admission: nothing to undo if it fails
    try:
        # Structured outputs: the choices' matchers are built in a worker thread, not on the event
        # loop (the grammar is translated once, then cached).
        constraint = specs[0].params.structured_outputs if specs else None
        if constraint is not None:
            await engine.prepare_structured_output(constraint, count=len(specs))
        streams = ChoiceStreams.admit(engine, specs, request_id, req.priority, cache_salt=req.cache_salt,
                                      stream=bool(req.stream), stall_probe=stall_probe)
        await streams.confirmed()  # an engine whose replicas admit later: their refusals fail it here
    except Exception as exc:  # noqa: BLE001 - ValueError/overload/dead -> 400/429/503
        raise from_engine_error(exc) from exc
    if slot is not None:
        slot.streams.append(streams)  # the shutdown finds it there, and the exchange's end (shutdown.py)
    if req.stream:
        return sse_response(job.stream(streams), headers=headers)
    return json_response(await job.full(streams), headers=headers)


def _request_scope() -> dict:
    from quart import has_request_context, request

    return request.scope if has_request_context() else {}


def parse_body(model: type[M], body: bytes) -> M:
    """Validate a raw JSON body; malformed JSON and invalid fields are 400s, never 500s."""
    if not body.strip():
        raise bad_request("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        req = model.model_validate_json(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None
    except ValueError as exc:  # e.g. invalid UTF-8
        raise bad_request(f"Malformed JSON body: {exc}", code="invalid_json") from None
    refused = unsupported_field(req)  # a known name (NOT_SUPPORTED_YET), safe to echo
    if refused is not None:
        raise bad_request(f"{refused} is not supported yet by this server", param=refused,
                          code="unsupported_parameter")
    ignored = ignored_fields(req)
    if ignored:
        # The names are the client's strings: shown escaped and bounded (describe_fields), never raw.
        logger.warning("ignored request fields (%d): %s", len(ignored), describe_fields(ignored))
    return req


def ignored_header(req) -> dict[str, str]:
    """``X-Aioinfer-Ignored-Fields``: the unknown fields the request was answered without."""
    ignored = ignored_fields(req)
    return {"X-Aioinfer-Ignored-Fields": describe_fields(ignored)} if ignored else {}


def new_request_id(prefix: str, client_id: Optional[str]) -> str:
    """``cmpl-<hex>`` / ``chatcmpl-<hex>``; a well-formed X-Request-Id from the client is kept (tracing)."""
    if client_id and _CLIENT_ID.match(client_id):
        return f"{prefix}-{client_id}"
    return f"{prefix}-{uuid.uuid4().hex}"


def stream_usage(stream_options, force: bool) -> tuple[bool, bool]:
    """(a usage chunk ends the stream, every chunk carries usage): ``stream_options`` as the client
    sent them; ``force``: ``--enable-force-include-usage``, which in vLLM means both, whatever the
    request says (vLLM's should_include_usage: usage on every chunk, and the final usage chunk)."""
    if force:
        return True, True
    include = stream_options is not None and stream_options.include_usage
    return include, include and stream_options.continuous_usage_stats


def tokens_as_ids(req, state) -> bool:
    """vLLM's return_tokens_as_token_ids: the request's own value, else the server's switch."""
    own = req.return_tokens_as_token_ids
    return state.config.return_tokens_as_token_ids if own is None else own


def now() -> int:
    return int(time.time())


@dataclass(slots=True)
class ChoiceResult:
    """Everything one choice has produced so far."""

    index: int
    prompt_index: int
    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprob_parts: list = field(default_factory=list)  # formatted per delta, joined at the end
    finish_reason: Optional[str] = None
    stop_reason: object = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    prompt_token_ids: list[int] = field(default_factory=list)

    def add(self, delta: GenerationDelta) -> None:
        self.text_parts.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason
        self.num_prompt_tokens = delta.num_prompt_tokens
        self.num_cached_tokens = delta.num_cached_tokens
        self.num_output_tokens = delta.num_output_tokens

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


def usage(choices: list[ChoiceResult], prompt_lengths: list[int]) -> dict:
    """OpenAI usage: each prompt counted once whatever n is; cached tokens summed over prompts."""
    cached: dict[int, int] = {}
    for choice in choices:
        cached[choice.prompt_index] = max(cached.get(choice.prompt_index, 0), choice.num_cached_tokens)
    prompt_tokens = sum(prompt_lengths)
    completion_tokens = sum(c.num_output_tokens for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(cached.values())},
    }


def check_not_shut_down(streams, results) -> None:
    """A non-streaming answer cut short by the server's shutdown is a 503, not a truncated 200."""
    if streams.shut_down and any(r.finish_reason == "abort" for r in results):
        raise shutting_down("The server shut down before the request finished; retry it.")


def stream_error_event(exc: BaseException) -> dict:
    return from_engine_error(exc).body()


def stop_reason_json(value: object) -> object:
    # The stop string or stop token id (vLLM's extra field); anything else is not JSON-safe.
    return value if isinstance(value, (str, int)) or value is None else str(value)
