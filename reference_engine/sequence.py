"""Requests, the sequences they are scheduled as, and what the engine returns for them.

A request with SamplingParams.n = 1 is one Sequence. With n > 1 it starts as one sequence; when its
prompt is prefilled it forks into n that share the prompt's blocks and sample independently.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

from .sampling import SamplingParams, StopStrings


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Timestamps on the engine's clock (time.perf_counter unless another clock is injected).

    TTFT = first_token_time - arrival_time; TPOT = (finish_time - first_token_time) / (tokens - 1);
    ITL = differences of token_times.
    """
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    num_preemptions: int = 0
    # Prefix caching: prompt tokens found in the cache when the request was first admitted (vLLM's
    # num_cached_tokens; 0 without prefix caching). Prefill computed only the rest.
    num_cached_tokens: int = 0
    # Speculative decoding (all 0 without it), vLLM's counters: steps that verified drafts for this sequence,
    # draft tokens they verified, and those the verifier kept.
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        """Kept drafts / verified drafts (None before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens a verifying target step emitted for this sequence on average: 1 + kept drafts per
        verification (vLLM's mean acceptance length). None before any verification."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None


class Sequence:
    # Disaggregated prefill (disagg.py): when True, finishing keeps the blocks (the prefill instance ships
    # them, then frees them with LLMEngine.release_kv); an abort still frees them.
    hold_kv: bool = False

    def __init__(self, seq_id: int, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 metrics: RequestMetrics, generator=None, index: int = 0, stop_ids: frozenset = frozenset()):
        self.seq_id, self.request_id, self.index = seq_id, request_id, index
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params, self.metrics, self.generator = params, metrics, generator
        self.stop_ids = stop_ids  # a sampled token in here ends the sequence with "stop"
        self.status = Status.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.block_table: list[int] = []
        self.pending_forks = params.n - 1  # children still to fork once the prompt is prefilled
        self.finish_reason: str | None = None
        # What ended it, as vLLM reports it: the stop string, or the stop_token_ids token (None for EOS).
        self.stop_reason: int | str | None = None
        self.output_text: str | None = None  # the detokenized output once a stop string cut it
        self.stop_strings = StopStrings(params.stop, params.include_stop_str_in_output, params.min_tokens) \
            if params.stop else None
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        # Per prompt token: None for the first, then {token: logprob} of the token and the top prompt_logprobs
        # (SamplingParams.prompt_logprobs), filled when the prompt has been computed.
        self.prompt_logprobs: list[dict[int, float] | None] | None = None
        # Tokens computed as prefill: the prompt; after a preemption, also every token that was in the cache
        # (recomputed like a prompt). Past this the sequence is decoding (one token, or k + 1 to verify drafts).
        self.prefill_until = len(prompt_token_ids)
        self._num_logits = 1
        self.kept_logits: list[torch.Tensor] = []  # rows of earlier chunks while num_logits > 1, [rows, vocab] each

    @property
    def num_logits(self) -> int:
        """Logit rows the next sampling step returns: those of the last num_logits tokens (1: only the last
        token's, which the next token is sampled from; no StepOutput.logits then). To verify k draft tokens
        appended to token_ids, set k + 1: with N = num_tokens before the step, StepOutput.logits [k + 1, vocab]
        holds the rows of positions N - k - 1 .. N - 1, row i scoring token N - k + i (row 0 the first draft,
        row k the token after the drafts, which the step samples from it). Only tokens not computed yet can
        give rows: 1 <= num_logits <= num_uncomputed_tokens when set. For one sampling step: the engine sets
        it back to 1 after the step that returns the rows."""
        return self._num_logits

    @num_logits.setter
    def num_logits(self, n: int) -> None:
        most = max(1, self.num_uncomputed_tokens)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= most:
            raise ValueError(f"num_logits={n!r} for {self!r}: the next step can give logit rows only for tokens it "
                             f"computes, 1 .. {most} here (append the draft tokens to token_ids first)")
        self._num_logits = n

    @property
    def in_prefill(self) -> bool:
        """Whether the next tokens computed are prefill (the prompt, or a recompute after preemption)."""
        return self.num_computed_tokens < self.prefill_until

    @property
    def in_decode_phase(self) -> bool:
        """Whether the scheduler's decode phase takes this sequence next step (scheduler.py, step 1): it runs and
        its next forward is one token (a decode, or a prompt's one-token last chunk) or it is past its prompt
        with draft tokens appended to verify."""
        return self.status is Status.RUNNING and (self.num_uncomputed_tokens == 1 or not self.in_prefill)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens the next forward must process: the rest of the prompt, or the last sampled token."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_slots(self) -> int:
        """Running-batch slots this sequence will occupy (its future forks included)."""
        return 1 + self.pending_forks

    @property
    def is_waiting(self) -> bool:
        return self.status is Status.WAITING

    def __repr__(self):
        return (f"Sequence(id={self.seq_id}, request={self.request_id!r}, status={self.status.value}, "
                f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, blocks={self.block_table})")


def output_text(seq: Sequence, tokenizer) -> str | None:
    """The sequence's output text: cut at its stop string if one matched (None without a tokenizer)."""
    if seq.output_text is not None:
        return seq.output_text
    return tokenizer.decode(seq.output_token_ids) if tokenizer is not None else None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None  # "stop", "length" or "abort"
    metrics: RequestMetrics
    logprobs: list[dict[int, float]] | None = None
    stop_reason: int | str | None = None  # the stop string or stop_token_ids token that ended it (vLLM's)


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    prompt_logprobs: list[dict[int, float] | None] | None = None  # with SamplingParams.prompt_logprobs

    # The first (for n = 1 the only) completion, flattened as vLLM users expect.
    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str | None:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def metrics(self) -> RequestMetrics:
        return self.outputs[0].metrics

    @property
    def logprobs(self) -> list[dict[int, float]] | None:
        return self.outputs[0].logprobs

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (vLLM's RequestOutput.num_cached_tokens)."""
        return self.outputs[0].metrics.num_cached_tokens


def request_output(seqs: list[Sequence], tokenizer) -> RequestOutput:
    """A request's RequestOutput from its sequences (one per sample, in index order)."""
    comps = [CompletionOutput(s.index, s.output_token_ids, output_text(s, tokenizer), s.finish_reason, s.metrics,
                              s.logprobs, s.stop_reason)
             for s in sorted(seqs, key=lambda s: s.index)]
    first = seqs[0]
    return RequestOutput(first.request_id, first.token_ids[:first.num_prompt_tokens], comps,
                         prompt_logprobs=first.prompt_logprobs)


@dataclass
class StepOutput:
    """What one step() produced for one sequence: its new tokens, and the full output once finished (or aborted)."""
    request_id: str
    index: int
    new_token_ids: list[int]  # empty for an aborted sequence; with speculative decoding, 1 to k + 1 tokens
    finished: bool
    finish_reason: str | None = None  # "stop", "length" or "abort" once finished
    output: RequestOutput | None = None  # set when the whole request (all n samples) has finished
    # [num_logits, vocab] float32 raw logits (before temperature) when the sequence asked for more than one
    # row (Sequence.num_logits); the new token was sampled from the last row. None otherwise (also when the
    # rows verified the engine's own drafts: speculative decoding consumes them).
    logits: torch.Tensor | None = None
    # With SamplingParams.logprobs: one {token: logprob} per new token (the token's and the top-k's, raw).
    logprobs: list[dict[int, float]] | None = None
    stop_reason: int | str | None = None  # once finished "stop": the stop string or stop token id (EOS: None)
    text: str | None = None  # once finished (not aborted): the sequence's whole output text, cut at a stop string
    prompt_logprobs: list[dict[int, float] | None] | None = None  # with the first token, if asked for


@dataclass
class StepStats:
    """Per-step counters the lessons plot. Tokens and sequences are counted by what each sequence is doing:
    prefill while it computes its prompt (or recomputes after a preemption; Sequence.in_prefill), decode after,
    so a prompt's one-token last chunk is prefill although it runs in the decode kernel."""
    step: int
    start_time: float
    wall_time: float  # seconds this step took
    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    num_running: int  # after the step
    num_waiting: int
    num_preempted: int
    blocks_used: int
    blocks_free: int
    # speculative decoding (0 without it): sequences that verified drafts this step, drafts verified, kept
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # prefix caching (0 without it): prompt tokens that sequences admitted this step found cached. With it,
    # blocks_free also counts cached blocks no request uses (evicted on demand), as vLLM's KV usage does.
    num_cached_tokens: int = 0
    # Seconds of wall_time spent in the model's forward (ModelRunner.execute after its inputs are built; on
    # CUDA timed between synchronizes, so the kernels are in it); wall_time - forward_time is the step's host
    # work: scheduling, block tables, input preparation, sampling, Python. On a modeled clock: the modeled
    # kernel time (StepTime.time_s - overhead_s). None when no forward ran (a step that only preempted). With
    # speculative decoding it is the target's forward; the draft model's proposals fall in the host part.
    forward_time: float | None = None
