"""POST /tokenize and /detokenize in vLLM's shapes."""

from __future__ import annotations

from aioinfer.entrypoints.openai.errors import bad_request, from_engine_error
from aioinfer.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from aioinfer.entrypoints.openai.server_state import ServerState
from aioinfer.entrypoints.openai.serving_chat import apply_chat_template
from aioinfer.entrypoints.openai.serving_common import parse_body


def tokenize(state: ServerState, body: bytes) -> dict:
    req = parse_body(TokenizeRequest, body)
    state.check_model(req.model)
    engine = state.ready_engine()
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("send exactly one of prompt and messages", param="prompt")
    if engine.tokenizer is None:
        raise bad_request("this model has no tokenizer", param="prompt")
    if req.messages is not None:
        if req.add_special_tokens:
            raise bad_request("add_special_tokens is not supported with messages (the template has them)",
                              param="add_special_tokens")
        ids = apply_chat_template(engine, req.messages, req.add_generation_prompt)
    else:
        add_special = True if req.add_special_tokens is None else req.add_special_tokens
        ids = list(engine.tokenizer.encode(req.prompt, add_special_tokens=add_special))
    return {
        "count": len(ids),
        "max_model_len": engine.max_model_len,
        "tokens": ids,
        "token_strs": engine.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None,
    }


def detokenize(state: ServerState, body: bytes) -> dict:
    req = parse_body(DetokenizeRequest, body)
    state.check_model(req.model)
    engine = state.ready_engine()
    if engine.tokenizer is None:
        raise bad_request("this model has no tokenizer", param="tokens")
    try:
        engine.tokenize(req.tokens)  # the same range check as a token-id prompt
    except ValueError as exc:
        raise bad_request(str(exc), param="tokens") from None
    except Exception as exc:  # noqa: BLE001
        raise from_engine_error(exc) from exc
    return {"prompt": engine.tokenizer.decode(req.tokens)}
