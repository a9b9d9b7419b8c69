"""The chat template: how a list of messages becomes one prompt string.

The shipped tokenizer has no chat template (its model is a plain language model), so the server defines
one, in the style of ChatML but with plain-text markers the tokenizer already splits:

    <|system|>
    You are terse.
    <|user|>
    Hi!
    <|assistant|>

Each message is its role marker on its own line, then its content on the next; the prompt ends with the
assistant marker so the model continues as the assistant. A model trained without this format will not
follow it well; the template only fixes what the server feeds the model, which is what a test compares.
"""
from __future__ import annotations

ROLES = ("system", "user", "assistant")


def apply_chat_template(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """messages: [{"role": "system" | "user" | "assistant", "content": str}, ...] -> the prompt string
    (add_generation_prompt=False: without the closing assistant marker, as /tokenize may ask).

    >>> apply_chat_template([{"role": "user", "content": "Hi!"}])
    '<|user|>\\nHi!\\n<|assistant|>\\n'
    """
    if not messages:
        raise ValueError("messages is empty: give at least one message")
    parts = []
    for m in messages:
        if m["role"] not in ROLES:
            raise ValueError(f"unknown role {m['role']!r}; use one of {ROLES}")
        parts.append(f"<|{m['role']}|>\n{m['content']}\n")
    return "".join(parts) + ("<|assistant|>\n" if add_generation_prompt else "")
