"""Request bodies and error bodies of the OpenAI API (the subset this server implements).

Unknown fields are ignored (clients send many); fields the engine cannot honour (stop strings, n > 1,
logprobs) are refused with a 400 that says so, rather than silently dropped.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM's extension
    n: int = 1
    seed: int | None = None
    stream: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM's extension
    ignore_eos: bool = False  # vLLM's extension
    logprobs: int | bool | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_completion_tokens: int | None = None  # the newer name the OpenAI client sends for max_tokens
