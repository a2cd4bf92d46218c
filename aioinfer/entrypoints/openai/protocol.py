"""Request bodies of the OpenAI-compatible API (pydantic, strict).

Strict mode on JSON input: ``"5"`` is not a number and ``1.5`` is not an integer, as in OpenAI's
API. Unknown top-level fields of completions and chat requests, and of chat messages, are accepted
and ignored, as vLLM does (a client's new field, ``metadata``, ``store``, ``reasoning_effort``, must
not break a working call): ``ignored_fields`` names them for a warning log line and the
``X-Aioinfer-Ignored-Fields`` response header, where ``describe_fields`` shows these client-chosen
strings escaped and bounded. Fields that would change the result but are not
supported yet (``NOT_SUPPORTED_YET``) are a 400 that says so. Nested objects (``stream_options``,
content parts, tools) stay strict. Range checks that ``SamplingParams`` also makes are repeated
here only where the pydantic error names the field better.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from typing_extensions import TypedDict  # pydantic needs this one below Python 3.12

from aioinfer.entrypoints.chat_content import check_part, content_text
from aioinfer.entrypoints.openai.structured import StructuredFields
from aioinfer.entrypoints.openai.tool_calls import ChatTool, ToolCall, ToolFields

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# Known fields (vLLM's or OpenAI's) that would change the output if honoured: refused, not ignored.
NOT_SUPPORTED_YET = frozenset({
    "truncate_prompt_tokens", "bad_words", "allowed_token_ids", "prediction", "audio", "modalities",
    "chat_template", "documents", "mm_processor_kwargs", "logits_processors",
    "vllm_xargs", "functions", "function_call", "kv_transfer_params",
})


# What the X-Aioinfer-Ignored-Fields header and the warning line show of the unknown fields: each name cut
# to _NAME_CHARS (escapes counted), at most _NAMES_SHOWN names, the rest counted. A client chooses these
# strings and their number; the operator's log and the response header must stay bounded and readable.
_NAME_CHARS = 64
_NAMES_SHOWN = 16


def ignored_fields(req: BaseModel) -> list[str]:
    """The unknown fields a request was sent with (``messages[i].name`` for a message's), in order, as
    the client wrote them: ``describe_fields`` makes them safe to show."""
    names = list(req.model_extra or ())
    # Only a body that declares ``messages`` has ChatMessage objects there: on /v1/completions an unknown
    # "messages" is whatever JSON the client sent (5, [1]), kept aside like any other unknown field.
    if "messages" in type(req).model_fields:
        for i, message in enumerate(req.messages or ()):
            names.extend(f"messages[{i}].{key}" for key in (message.model_extra or ()))
    return names


def unsupported_field(req: BaseModel) -> Optional[str]:
    """The first unknown field that is in ``NOT_SUPPORTED_YET`` (top level, or a message's), or None."""
    for name in req.model_extra or ():
        if name in NOT_SUPPORTED_YET:
            return name
    if "messages" in type(req).model_fields:
        for i, message in enumerate(req.messages or ()):
            for key in message.model_extra or ():
                if key in NOT_SUPPORTED_YET:
                    return f"messages[{i}].{key}"
    return None


def describe_fields(names: list[str]) -> str:
    """``names`` for a response header or a log line: ``"a, b, c"``; printable ASCII only (any other
    character, the comma, the backslash and the space as a Python escape, so that a CR/LF can neither
    end the header nor start a forged log line), each cut to ``_NAME_CHARS`` characters ("..." marks a
    cut), at most ``_NAMES_SHOWN`` names and then how many more."""
    shown = []
    for name in names[:_NAMES_SHOWN]:
        text = "".join(_printable(ch) for ch in name[:_NAME_CHARS]) or '""'  # an empty name, seen
        shown.append(text[:_NAME_CHARS] + "..." if len(text) > _NAME_CHARS or len(name) > _NAME_CHARS else text)
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" (+{more} more)" if more else "")


def _printable(ch: str) -> str:
    if "!" <= ch <= "~" and ch not in ",\\":
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage in every chunk


class _SamplingFields(_Strict, StructuredFields):
    """Fields shared by completions and chat (OpenAI's and vLLM's common extras; the structured-output
    ones in structured.py). Unknown ones are kept aside (``ignored_fields``)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: Optional[str] = None  # optional as in vLLM: absent means the served model
    temperature: Optional[float] = Field(default=None, ge=0)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    top_k: Optional[int] = Field(default=None, ge=-1)
    min_p: Optional[float] = Field(default=None, ge=0, le=1)
    n: int = Field(default=1, ge=1)
    seed: Optional[int] = Field(default=None, ge=-(2**63), lt=2**64)
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2, le=2)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2, le=2)
    repetition_penalty: Optional[float] = Field(default=None, gt=0)
    logit_bias: Optional[dict[str, float]] = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None  # accepted and ignored (OpenAI's abuse-monitoring id)
    priority: int = 0  # vLLM: lower runs first under priority scheduling
    cache_salt: Optional[str] = Field(default=None, min_length=1)  # vLLM: prefix-cache isolation per tenant
    # vLLM: logprobs name every token "token_id:<id>" (text that is not valid UTF-8 alone stays exact);
    # None: the server's --return-tokens-as-token-ids
    return_tokens_as_token_ids: Optional[bool] = None
    # vLLM: top-N logprobs of every prompt token (given the tokens before it); -1: the whole vocabulary
    # Logprob counts are capped by the engine's max_logprobs (--max-logprobs; sampling.check_logprobs_cap)
    prompt_logprobs: Optional[int] = Field(default=None, ge=-1)
    # vLLM: the generated token ids on each choice, and the prompt's (completions: on the choice; chat:
    # on the response); streams: each chunk's new ids, the prompt's on the first chunk
    return_token_ids: Optional[bool] = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value):
        items = [value] if isinstance(value, str) else value
        if items is not None and not all(items):
            raise ValueError("stop strings must be non-empty")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, value):
        if value is not None and any(t < 0 for t in value):
            raise ValueError("token ids must be >= 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value):
        if value is None:
            return value
        for key, bias in value.items():
            if not key.lstrip("-").isdigit() or int(key) < 0:
                raise ValueError(f"keys must be token ids, got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"biases must be in [-100, 100], got {bias}")
        return value


class CompletionRequest(_SamplingFields):
    prompt: Any  # str | list[str] | list[int] | list[list[int]], checked below for a clear message
    max_tokens: Optional[int] = Field(default=16, ge=1)  # OpenAI's and vLLM's default for completions
    logprobs: Optional[int] = Field(default=None, ge=0)
    echo: bool = False
    suffix: Optional[str] = None  # accepted only to say it is unsupported
    best_of: Optional[int] = Field(default=None, ge=1)
    add_special_tokens: bool = True

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        return check_prompt(value)


class TextPart(TypedDict):
    """A content part; a dict (not a model) so that chat_content.content_text reads it as the offline
    LLM.chat reads the user's dicts."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)  # type: ignore[misc]
    type: Literal["text"]
    text: str


def _text_only(part: Any) -> Any:
    check_part(part)  # "type 'image_url' is not supported: this model takes text only", not "should be 'text'"
    return part


def _json_bool_string(value: Any) -> Any:
    """"true" / "false" for chat ``logprobs``: vLLM's lax parsing takes them, and its own test of
    ``top_logprobs: -1`` sends ``"logprobs": "true"``. Only these two strings; the rest stays strict."""
    return {"true": True, "false": False}.get(value, value) if isinstance(value, str) else value


class ChatMessage(_Strict):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)  # see ignored_fields
    # OpenAI's five roles, or any other name (vLLM's custom roles): the chat template decides what it
    # makes of one, and a template that refuses it is a 400 naming its reason (apply_chat_template).
    role: str = Field(min_length=1)
    content: Union[str, list[Annotated[TextPart, BeforeValidator(_text_only)]], None] = None
    name: Optional[str] = None
    tool_call_id: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None  # an assistant's earlier calls

    def text(self) -> str:
        return content_text(self.content) or ""

    def for_template(self) -> dict:
        message = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            message["tool_calls"] = [call.for_template() for call in self.tool_calls]
        return message


class _TemplateFields(BaseModel):
    """How the messages are rendered (vLLM's fields): mixed into the chat body and /tokenize's."""

    add_generation_prompt: bool = True
    # vLLM: the last (assistant) message left open, so the reply continues it
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None  # vLLM: extra variables for the chat template

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value):
        reserved = sorted(set(value or ()) & RESERVED_TEMPLATE_KWARGS)
        if reserved:
            raise ValueError(f"{reserved} are set by the request itself, not through chat_template_kwargs")
        return value

    def template_options(self) -> dict[str, Any]:
        """What the chat template is rendered with besides the messages and tools."""
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message needs add_generation_prompt false")
        return {**(self.chat_template_kwargs or {}), "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message}


class ChatCompletionRequest(_SamplingFields, ToolFields, _TemplateFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(default=None, ge=1)  # deprecated alias of max_completion_tokens
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)  # None: the rest of the context
    logprobs: Annotated[bool, BeforeValidator(_json_bool_string)] = False
    top_logprobs: Optional[int] = Field(default=None, ge=-1)  # -1: the whole vocabulary (vLLM)
    # vLLM: the reply starts with the last message's text when that message is the assistant's (with
    # continue_final_message: the whole message, not only its continuation)
    echo: bool = False

    def echoed_text(self) -> str:
        """What ``echo`` puts before the reply: the last message's text if it is the assistant's."""
        last = self.messages[-1]
        return last.text() if self.echo and last.role == "assistant" else ""


# Arguments of the tokenizer's apply_chat_template that the request sets in its own fields.
RESERVED_TEMPLATE_KWARGS = frozenset({"conversation", "messages", "tools", "tokenize", "chat_template",
                                      "add_generation_prompt", "continue_final_message", "return_dict"})


class TokenizeRequest(_Strict, _TemplateFields):
    """vLLM's /tokenize: either ``prompt`` (completion style) or ``messages`` (chat template). With
    messages, the prompt a chat completion of the same fields would get: the template rendered with
    ``tools``, ``chat_template_kwargs``, ``add_generation_prompt`` or ``continue_final_message``."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None
    # default: True for prompt; False for messages, whose template adds its own (True adds the
    # tokenizer's on top of them, as vLLM's does)
    add_special_tokens: Optional[bool] = None
    tools: Optional[list[ChatTool]] = None  # rendered as a chat request's are
    return_token_strs: bool = False


class DetokenizeRequest(_Strict):
    model: Optional[str] = None
    tokens: list[int]


def check_prompt(value: Any) -> Union[str, list[str], list[int], list[list[int]]]:
    """OpenAI's four prompt forms; anything else is a ValueError with a readable message."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise ValueError("prompt must be a string, a list of strings, a list of token ids or a list of "
                         "token-id lists, and not empty")
    if all(isinstance(p, str) for p in value):
        return value
    if _are_token_ids(value):
        return value
    if all(isinstance(p, list) and p and _are_token_ids(p) for p in value):
        return value
    raise ValueError("prompt must be a string, a list of strings, a list of token ids (integers >= 0) or a "
                     "list of non-empty token-id lists")


def _are_token_ids(values: list) -> bool:
    """Integers >= 0, bools excluded. JSON gives plain ints: two C-level passes decide those (a
    prompt is thousands of ids, checked on the event loop per request); the per-id test is the rest."""
    if set(map(type, values)) == {int}:
        return min(values) >= 0
    return all(_is_token_id(t) for t in values)


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
