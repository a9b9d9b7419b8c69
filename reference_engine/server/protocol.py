"""Request bodies and error bodies of the OpenAI API (the subset this server implements, with vLLM's extensions).

Three kinds of request field:
  - implemented: declared below with their JSON types;
  - known but not implemented (tools, response_format, suffix, beam search, ...: UNSUPPORTED): refused with a
    400 naming the field whenever it asks for something (a value other than "not used"), never dropped;
  - unknown: ignored with a logged warning naming them, as vLLM's OpenAIBaseModel does (clients send many
    fields of their own). `user` is accepted and ignored, as by OpenAI and vLLM.
Numbers are strict: a count must be a JSON integer (true, "16" and 16.0 are refused, where pydantic's lax
mode would read them as 1 and 16), a real number a JSON number (not a bool, not a string). The ranges are
SamplingParams' to check, except the server's own bounds here (stop strings, logprobs, n).
"""
from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

log = logging.getLogger(__name__)

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_STOP_STRINGS = 32  # OpenAI takes 4, vLLM any number; each is searched after every token
MAX_STOP_CHARS = 256
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs; OpenAI's chat top_logprobs takes 0..20 too
MAX_N = 16  # samples per request (the engine also needs n <= max_num_seqs)


class APIError(Exception):
    """An error the client caused (or a missing model): status and OpenAI's error body fields."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    """{"error": {"message", "type", "param", "code"}}: the shape every OpenAI client parses."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool | None = None  # a last chunk with the usage and no choices
    continuous_usage_stats: StrictBool | None = None  # vLLM's: every chunk carries the usage so far


class _Request(BaseModel):
    """Fields both endpoints take. Unknown fields are kept (model_extra) so that they can be named in the
    warning; UNSUPPORTED ones are declared as Any so that refuse_unsupported() sees what was sent."""
    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: StrictInt | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None  # vLLM's extension
    min_p: StrictFloat | None = None  # vLLM's extension
    n: StrictInt = 1
    best_of: StrictInt | None = None  # accepted only as n (no sample is generated and thrown away)
    seed: StrictInt | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None  # vLLM's extension
    include_stop_str_in_output: StrictBool = False  # vLLM's extension
    ignore_eos: StrictBool = False  # vLLM's extension
    min_tokens: StrictInt = 0  # vLLM's extension
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None  # vLLM's extension
    logit_bias: dict[str, StrictFloat] | None = None
    user: str | None = None  # accepted and ignored (OpenAI's end-user id; vLLM ignores it too)
    return_token_ids: StrictBool | None = None  # vLLM's: every choice carries token_ids here anyway
    request_id: StrictStr | None = Field(None, min_length=1, max_length=256)  # vLLM's: the response id's suffix


class CompletionRequest(_Request):
    prompt: str | list[StrictInt] | list[str] | None = None
    logprobs: StrictInt | None = None  # top alternatives per token, legacy shape
    echo: StrictBool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_completion_tokens: StrictInt | None = None  # OpenAI's newer name for max_tokens; it wins
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize body: a prompt, or chat messages (with the chat template)."""
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True
    add_special_tokens: StrictBool = True  # the shipped tokenizer adds none either way
    return_token_strs: StrictBool = False


class DetokenizeRequest(BaseModel):
    """vLLM's /detokenize body."""
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[StrictInt]


def _off(*values):
    """The values (besides None) that mean a field asks for nothing."""
    return values


# field -> the values (besides null) that ask for nothing; any other value is refused with a 400 naming it.
UNSUPPORTED: dict[str, tuple] = {
    "use_beam_search": _off(False), "length_penalty": _off(1, 1.0), "early_stopping": _off(False),
    "response_format": _off({"type": "text"}), "structured_outputs": _off(), "guided_json": _off(),
    "guided_regex": _off(), "guided_choice": _off(), "guided_grammar": _off(), "guided_decoding_backend": _off(),
    "guided_whitespace_pattern": _off(), "logits_processors": _off([]), "allowed_token_ids": _off(),
    "bad_words": _off([]), "prompt_logprobs": _off(), "logprob_token_ids": _off(), "truncate_prompt_tokens": _off(),
    "skip_special_tokens": _off(True), "spaces_between_special_tokens": _off(True), "prompt_embeds": _off(),
    "priority": _off(0), "cache_salt": _off(), "kv_transfer_params": _off(), "vllm_xargs": _off(),
    "return_tokens_as_token_ids": _off(False), "repetition_detection": _off(), "thinking_token_budget": _off(),
    "add_special_tokens": _off(True, False), "stream_interval": _off(1),
}
UNSUPPORTED_COMPLETION = {**UNSUPPORTED, "suffix": _off("")}
UNSUPPORTED_CHAT = {
    **UNSUPPORTED, "tools": _off(), "tool_choice": _off("none"), "functions": _off(), "function_call": _off("none"),
    "parallel_tool_calls": _off(True, False), "audio": _off(), "modalities": _off(["text"]), "prediction": _off(),
    "web_search_options": _off(), "reasoning_effort": _off(), "echo": _off(False), "add_generation_prompt": _off(True),
    "continue_final_message": _off(False), "chat_template": _off(), "chat_template_kwargs": _off({}),
    "documents": _off(), "mm_processor_kwargs": _off(), "store": _off(False), "metadata": _off(),
    "service_tier": _off("auto", "default"),
}


def refuse_unsupported(body: _Request, table: dict[str, tuple]) -> None:
    """A 400 naming the first known-but-unsupported field that asks for something; a logged warning naming
    the unknown fields (ignored, as vLLM ignores them)."""
    extra: dict[str, Any] = dict(body.model_extra or {})
    for name, off in table.items():
        if name in extra:
            value = extra.pop(name)
            if value is not None and not any(value == v and type(value) is type(v) for v in off):
                raise APIError(400, f"{name} is not supported by this server ({name}={_short(value)}); see the "
                                    "README's table of supported parameters", param=name, code="unsupported_parameter")
    if extra:
        log.warning("The following fields were present in the request but ignored: %s", sorted(extra))


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
