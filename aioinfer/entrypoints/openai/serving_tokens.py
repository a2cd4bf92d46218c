"""POST /tokenize and /detokenize, and GET /tokenizer_info, in vLLM's shapes."""

from __future__ import annotations

from aioinfer.entrypoints.openai.errors import APIError, bad_request, from_engine_error
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
        try:
            options = req.template_options()
        except ValueError as exc:
            raise bad_request(str(exc), param="continue_final_message") from None
        # the prompt a chat completion with these fields gets (its tools rendered the same way), plus
        # the tokenizer's special tokens if asked (vLLM's add_special_tokens, off for messages)
        tools = [tool.model_dump(exclude_none=True) for tool in req.tools] if req.tools else None
        ids = apply_chat_template(engine, req.messages, tools=tools, chat_template=state.chat_template,
                                  add_special_tokens=bool(req.add_special_tokens), **options)
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


def tokenizer_info(state: ServerState) -> dict:
    """The tokenizer's configuration as its tokenizer_config.json would hold it (vLLM's
    ``/tokenizer_info``): its init arguments, ``tokenizer_class``, the added tokens by id and the
    chat template, every value made JSON (an object JSON cannot hold becomes its string)."""
    engine = state.ready_engine()
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise APIError(404, "this model has no tokenizer", code="not_found")
    info = {name: value for name, value in getattr(tokenizer, "init_kwargs", {}).items()
            if not name.startswith("_")}
    info["tokenizer_class"] = type(tokenizer).__name__
    info["added_tokens_decoder"] = {str(token_id): _added_token(token)
                                    for token_id, token in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    if state.chat_template or getattr(tokenizer, "chat_template", None):
        info["chat_template"] = state.chat_template or tokenizer.chat_template
    info.setdefault("model_max_length", engine.max_model_len)
    return _json_safe(info)


def _added_token(token) -> dict:
    state = token.__getstate__() if hasattr(token, "__getstate__") else None
    return dict(state) if isinstance(state, dict) else {"content": str(token)}


def _json_safe(value):
    if isinstance(value, int) and not isinstance(value, bool) and not -2 ** 63 <= value < 2 ** 63:
        return float(value)  # transformers' "no limit" model_max_length is 1e30, beyond a JSON int64
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_json_safe(item) for item in value]
    return str(value)
