"""Request bodies and error bodies of the OpenAI API (the subset this server implements).

Unknown fields are ignored (clients send many); fields the engine cannot honour (stop strings, n > 1,
logprobs) are refused with a 400 that says so, rather than silently dropped. Numbers are strict: a count
must be a JSON integer (true, "16" and 16.0 are refused, where pydantic's lax mode would read them as 1 and
16), a real number a JSON number (not a bool, not a string). The ranges are SamplingParams' to check.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt


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


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: StrictInt | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None  # vLLM's extension
    min_p: StrictFloat | None = None  # vLLM's extension
    n: StrictInt = 1
    seed: StrictInt | None = None
    stream: StrictBool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None  # vLLM's extension
    ignore_eos: StrictBool = False  # vLLM's extension
    logprobs: StrictBool | StrictInt | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[StrictInt] | list[str] | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_completion_tokens: StrictInt | None = None  # the newer name the OpenAI client sends for max_tokens
