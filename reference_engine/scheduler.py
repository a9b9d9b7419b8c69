"""Iteration-level scheduling: each step picks which sequences run and how many tokens each computes.

Order of a step (vLLM V1 / Sarathi-Serve style, one token budget for everything):
  1. every running sequence in decode (one uncomputed token) gets its token, oldest first; if the
     cache has no block for it, the newest running sequence is preempted (recompute: blocks freed,
     back to the front of the waiting queue) until it fits;
  2. the SchedulerPolicy spends what is left of the token budget on prefill: chunks of prompts in
     progress and newly admitted waiting requests (none in a step that preempted). If nothing at
     all can run because partly prefilled prompts fill the cache, the newest is preempted and the
     policy asked again. A policy that picks nothing while nothing else runs, although the oldest
     started prompt's next chunk (or, with nothing running, the first waiting request) fits, is
     broken (the engine would stall, or preempt and re-prefill forever): the scheduler raises
     RuntimeError naming the fault instead.
A prompt whose last chunk is a single token finishes in the decode batch (it is one query token
against cached context, exactly a decode), so a policy never sees it.

Speculative decoding (spec_decode.py): a sequence past its prompt with k draft tokens appended has k + 1
uncomputed tokens. It is still decoding, so step 1 schedules it, all k + 1 tokens at once (the engine
sizes drafts to the budget), as one chunk run by the prefill kernel; it is never a policy candidate.
Step 1 leaves one token of the budget for every later sequence of the decode phase, so a plain decode
always gets its token (drafts appended by hand beyond the budget are verified over several steps).

After the forward (vLLM v1's order: schedule -> execute -> sample -> update_from_output): the engine samples
or verifies, and update_from_output applies the result here, the one place the queues and the sequences'
bookkeeping change: num_computed_tokens moves on, forked samples join the batch, verified drafts roll back
(rollback), tokens are appended, and a sequence a stop condition ends finishes and frees its blocks. Aborts
(finish_request) and disaggregated prefill's received requests (allocate_received, add_received) are
scheduler operations too.

Prefix caching (prefix_cache.py, enable_prefix_caching=True): a step first publishes the full blocks
running sequences have computed; before the policy runs, each waiting candidate is looked up and starts
with its cached prefix counted as computed (num_computed_tokens, block_table), so a policy sees and
budgets only the tokens left to compute; lookups of requests it does not admit are undone.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .block_manager import BlockManager
from .sequence import Sequence, Status, StepOutput, output_text

if TYPE_CHECKING:
    from .engine_config import EngineConfig


@dataclass
class ScheduledSeq:
    """One sequence's share of a step. Read num_computed_tokens-based properties before the step moves it on."""
    seq: Sequence
    num_tokens: int  # tokens computed this step, from seq.num_computed_tokens on
    num_logits: int = 1  # logit rows this chunk yields: those of its last num_logits tokens (0: none)

    @classmethod
    def chunk(cls, seq: Sequence, num_tokens: int) -> ScheduledSeq:
        """seq's next num_tokens tokens, yielding the rows of those among its last seq.num_logits tokens: the last
        token's row when the chunk reaches it, and with num_logits > 1 the rows of earlier (draft) tokens,
        whichever chunk computes them."""
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_tokens
        return cls(seq, num_tokens, max(0, end - max(start, seq.num_tokens - seq.num_logits)))

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the last known token, so its logits give the next one."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    decodes: list[ScheduledSeq] = field(default_factory=list)
    prefills: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) copy-on-write
    num_cached_tokens: int = 0  # prefix caching: tokens admitted sequences found cached (not computed)

    @property
    def scheduled(self) -> list[ScheduledSeq]:
        return self.decodes + self.prefills  # the batch order: decode rows first


@dataclass
class SampledTokens:
    """What sampling, or verification, produced for one sequence in a step; Scheduler.update_from_output
    applies it. token_ids: the sampled token, or after verifying num_drafts drafts the verifier's tokens (the
    kept drafts, then one of the target's own). logprobs: one raw {token: logprob} per token when the request
    asks for them; logits: the rows of a sequence that asked for num_logits > 1 (StepOutput.logits);
    prompt_logprobs: the request's, with its first token."""
    seq: Sequence
    token_ids: list[int]
    num_drafts: int = 0
    logprobs: list[dict[int, float]] | None = None
    logits: Any = None
    prompt_logprobs: list | None = None


@dataclass
class SamplerOutput:
    """One step's sampling results (vLLM's ModelRunnerOutput). forks: parallel sampling, a parent whose prompt
    was computed this step and the n - 1 children sampled with it (they join the batch now); failed: request id
    -> (the exception its sampling raised, all its sequences), each request ending with "error"."""
    sampled: list[SampledTokens] = field(default_factory=list)
    verified: list[SampledTokens] = field(default_factory=list)
    forks: list[tuple[Sequence, list[Sequence]]] = field(default_factory=list)
    failed: dict[str, tuple[BaseException, list[Sequence]]] = field(default_factory=dict)


class Budget:
    """What a SchedulerPolicy may still spend this step: tokens, batch slots and free KV blocks."""

    def __init__(self, tokens: int, slots: int, block_manager: BlockManager, chunked_prefill: bool):
        self.tokens, self.slots, self.chunked_prefill = tokens, slots, chunked_prefill
        self.free_blocks = block_manager.num_free()
        self._bm = block_manager

    def fits(self, seq: Sequence, num_tokens: int) -> bool:
        return (0 < num_tokens <= min(self.tokens, seq.num_uncomputed_tokens)
                and (not seq.is_waiting or seq.num_slots <= self.slots)
                and self._bm.blocks_needed(seq, num_tokens) <= self.free_blocks)

    def take(self, seq: Sequence, num_tokens: int) -> None:
        self.tokens -= num_tokens
        self.free_blocks -= self._bm.blocks_needed(seq, num_tokens)
        if seq.is_waiting:
            self.slots -= seq.num_slots

    def try_take(self, seq: Sequence, num_tokens: int) -> bool:
        if not self.fits(seq, num_tokens):
            return False
        self.take(seq, num_tokens)
        return True


class FCFSPolicy:
    """The engine's policy: first come, first served, no skipping ahead of a request that does not fit.

    Candidates arrive oldest first: prompts already being prefilled, then the waiting queue. With
    chunked prefill a prompt takes whatever budget is left (a chunk); without, all of it or nothing.
    """

    def schedule(self, candidates: list[Sequence], budget: Budget) -> list[tuple[Sequence, int]]:
        picked = []
        for seq in candidates:
            n = seq.num_uncomputed_tokens
            if budget.chunked_prefill:
                n = min(n, budget.tokens)
            if not budget.try_take(seq, n):
                break
            picked.append((seq, n))
        return picked


def _stamp_first_scheduled(chunks: list[ScheduledSeq], now: float) -> None:
    for s in chunks:
        if s.seq.metrics.first_scheduled_time is None:
            s.seq.metrics.first_scheduled_time = now


class Scheduler:
    """The only owner of the waiting and running queues. Each step: schedule() picks the batch,
    update_from_output() applies what the forward and the sampler produced (tokens appended, sequences
    finished and their blocks freed). Speculative rollback, parallel-sampling forks, aborts and disaggregated
    prefill's received requests go through its methods too.

    config: a resolved engine_config.EngineConfig (its scheduler part and clock); eos_token_ids and tokenizer:
    the model's, for the stop checks (EOS, stop strings) and the finished outputs' text."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager, eos_token_ids=(), tokenizer=None):
        c = config.scheduler
        self.bm, self.policy = block_manager, c.policy() if isinstance(c.policy, type) else (c.policy or FCFSPolicy())
        self.max_num_seqs, self.max_num_batched_tokens = c.max_num_seqs, c.max_num_batched_tokens
        self.chunked_prefill = c.enable_chunked_prefill
        self.max_seq_len = c.max_seq_len  # a sequence this long ends ("length")
        self.clock, self.eos, self.tokenizer = config.clock, frozenset(eos_token_ids), tokenizer
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last one is preempted first

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> SchedulerOutput:
        """This step's batch (the module docstring's order). now: the step's start, the first_scheduled_time of
        a request scheduled for the first time."""
        out = SchedulerOutput()
        self.bm.publish(self.running)  # prefix caching: full blocks computed so far become findable
        phase = [s for s in self.running if s.in_decode_phase]
        used = 0
        for i, seq in enumerate(phase):
            if seq.status is not Status.RUNNING:  # preempted for an older one meanwhile
                continue
            n = seq.num_uncomputed_tokens
            if n > 1:  # drafts: keep a token for each later decode (the budget covers max_num_seqs of them)
                n = min(n, self.max_num_batched_tokens - used - sum(s.status is Status.RUNNING for s in phase[i + 1:]))
            used += self._schedule_decode(seq, n, out)
        while True:
            # After a preemption, admit nobody new this step (as vLLM does): the freed blocks would
            # otherwise go straight back to the victim's re-prefill and the cache would thrash.
            admit = not out.preempted or not self.running
            started = [s for s in self.running if s.num_uncomputed_tokens > 1 and s.in_prefill]  # partly prefilled prompts
            candidates = started + (list(self.waiting) if admit else [])
            self._lookup(candidates)
            decisions = self.policy.schedule(candidates, self._budget(used))
            self._check(decisions, candidates, used)
            if decisions or out.decodes or out.prefills:
                break
            self._check_progress(started, used)  # nothing runs: the policy must pick something
            if not self.running:
                break
            self._preempt_newest(out)  # only partly prefilled prompts run and none can grow
        out.num_cached_tokens = self.bm.commit([seq for seq, _ in decisions if seq.is_waiting])
        self.bm.forget(self.waiting)  # looked up, not admitted: back to no blocks
        for seq, n in decisions:
            if seq.is_waiting:
                self.waiting.remove(seq)
                seq.status = Status.RUNNING
                self.running.append(seq)
            out.block_copies += self.bm.reserve(seq, n)
            out.prefills.append(ScheduledSeq.chunk(seq, n))
        _stamp_first_scheduled(out.prefills, now)
        return out

    def _schedule_decode(self, seq: Sequence, n: int, out: SchedulerOutput) -> int:
        """n tokens of a decoding sequence (1, or up to k + 1 with drafts), preempting the newest running
        sequences until its blocks fit. Returns the tokens scheduled (0 if seq itself was preempted)."""
        while not self.bm.can_reserve(seq, n):
            if self._preempt_newest(out) is seq:
                return 0
        out.block_copies += self.bm.reserve(seq, n)
        (out.decodes if n == 1 else out.prefills).append(ScheduledSeq.chunk(seq, n))  # > 1 query: prefill kernel
        return n

    def _lookup(self, candidates: list[Sequence]) -> None:
        """Prefix caching: a waiting candidate that could join the batch starts with its cached prefix
        (tentatively: committed only if the policy admits it), so the policy sees only what is left to
        compute. Earlier lookups are undone first: the cache may have changed since."""
        self.bm.forget(self.waiting)
        slots = self.max_num_seqs - self._num_slots_used()
        # A sequence asking for more than one logit row (prompt logprobs) computes every token it wants rows
        # for: it skips the cache, as vLLM skips reading it for prompt_logprobs.
        self.bm.lookup([s for s in candidates if s.is_waiting and s.num_slots <= slots and s.num_logits == 1])

    def _preempt_newest(self, out: SchedulerOutput) -> Sequence:
        victim = self.running[-1]  # FCFS priority: the latest admitted loses its cache first
        self.preempt(victim)
        out.preempted.append(victim)
        return victim

    def preempt(self, seq: Sequence) -> None:
        """Recompute preemption: drop the KV, keep the tokens; re-prefilled later, nothing is lost."""
        self.running.remove(seq)
        self.bm.free(seq)
        seq.prefill_until = max(seq.prefill_until, seq.num_computed_tokens)  # recomputing them is prefill
        seq.kept_logits.clear()  # the re-prefill computes those rows again
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        seq.metrics.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ---- after the forward ----------------------------------------------------------------------
    def update_from_output(self, so: SchedulerOutput, sampled: SamplerOutput) -> list[StepOutput]:
        """Apply a step: every scheduled chunk's tokens are computed now; forked children join the batch;
        verified drafts are rolled back to what the verifier kept; each failed request ends ("error"); every
        new token is appended, and a sequence it ends finishes and frees its blocks (hold_kv: keeps them).
        Returns a StepOutput per sequence that got tokens or ended, verified ones first, then the failed
        requests', then the sampled; a request's RequestOutput is the engine's to add (it holds the requests)."""
        for s in so.scheduled:
            s.seq.num_computed_tokens += s.num_tokens
        for parent, children in sampled.forks:
            self.fork(parent, children)
        if not (sampled.sampled or sampled.verified or sampled.failed):
            return []
        now = self.clock()
        outputs = [self._append_verified(t, now) for t in sampled.verified]
        for _, seqs in sampled.failed.values():  # a row whose sampling raised ends its request (all n samples) alone
            outputs += self.finish_request(seqs, "error")
        return outputs + [self._append_sampled(t, now) for t in sampled.sampled]

    def _append_sampled(self, t: SampledTokens, now: float) -> StepOutput:
        seq = t.seq
        if t.prompt_logprobs is not None and seq.prompt_logprobs is None:
            seq.prompt_logprobs = t.prompt_logprobs
        if t.logprobs is not None:
            seq.logprobs.append(t.logprobs[0])
        out = self._append_token(seq, t.token_ids[0], now)
        out.logits, out.logprobs = t.logits, t.logprobs
        if seq.prompt_logprobs is not None and seq.num_output_tokens == 1:
            out.prompt_logprobs = seq.prompt_logprobs
        return out

    def _append_verified(self, t: SampledTokens, now: float) -> StepOutput:
        """Speculative decoding: the drafts leave, then the verifier's tokens are appended one by one until one
        ends the sequence; one StepOutput carries them all."""
        seq, tokens = t.seq, t.token_ids
        self.rollback(seq, t.num_drafts, len(tokens) - 1)
        for i, tok in enumerate(tokens):
            if t.logprobs is not None:
                seq.logprobs.append(t.logprobs[i])
            out = self._append_token(seq, tok, now)
            if out.finished:
                break
        out.new_token_ids = tokens[:i + 1]
        out.logprobs = None if t.logprobs is None else t.logprobs[:i + 1]
        return out

    def _append_token(self, seq: Sequence, token: int, now: float) -> StepOutput:
        seq.token_ids.append(token)
        m = seq.metrics
        m.token_times.append(now)
        if m.first_token_time is None:
            m.first_token_time = now
        reason = self._stop(seq, token)
        out = StepOutput(seq.request_id, seq.index, [token], reason is not None, reason)
        if reason:
            seq.finish_reason, m.finish_time = reason, now
            out.stop_reason, out.text = seq.stop_reason, output_text(seq, self.tokenizer)
            self.finish(seq, free=not seq.hold_kv)
        return out

    def _stop(self, seq: Sequence, token: int) -> str | None:
        """Why the token just appended ends seq ("stop", "length"), or None; sets stop_reason (and output_text
        when a stop string matched)."""
        if token in seq.stop_ids:  # EOS (stop_reason None, as vLLM) or one of stop_token_ids
            seq.stop_reason = token if token in seq.params.stop_token_ids and (
                seq.params.ignore_eos or token not in self.eos) else None
            return "stop"
        hit = None
        if seq.stop_strings is not None:
            hit = seq.stop_strings.check(self.tokenizer.decode(seq.output_token_ids), seq.num_output_tokens)
        if hit is not None:
            seq.stop_reason = hit[0]
            seq.output_text = self.tokenizer.decode(seq.output_token_ids)[:hit[1]]
            return "stop"
        if seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= self.max_seq_len:
            return "length"
        return None

    def fork(self, parent: Sequence, children: list[Sequence]) -> None:
        """Parallel sampling: the children (sampled with their parent this step, once its prompt is computed)
        join the batch right after it, sharing its blocks (ref counts; copy-on-write later)."""
        for child in children:
            child.num_computed_tokens, child.status = parent.num_computed_tokens, Status.RUNNING
            self.bm.fork(parent, child)
        parent.pending_forks = 0
        at = self.running.index(parent) + 1
        self.running[at:at] = children

    def rollback(self, seq: Sequence, num_drafts: int, num_kept: int = 0) -> None:
        """Speculative decoding: seq's last num_drafts tokens (drafts) leave token_ids. A running sequence
        whose drafts were just verified keeps num_kept of them in the cache (num_computed_tokens ends after
        them; the caller appends the verifier's tokens, the kept drafts first) and frees the blocks past them;
        a preempted or finished one (num_kept 0) only loses the tokens."""
        base = seq.num_tokens - num_drafts
        del seq.token_ids[base:]
        seq.num_logits = 1
        if seq.status is Status.RUNNING:
            seq.num_computed_tokens = base + num_kept
            self.bm.trim(seq)

    def finish_request(self, seqs: list[Sequence], reason: str) -> list[StepOutput]:
        """End every unfinished sequence of a request now with `reason` ("abort", "error"), freeing its
        blocks. Returns one StepOutput (no tokens) per sequence ended."""
        now, ended = self.clock(), []
        for seq in seqs:
            if seq.status is not Status.FINISHED:
                self.finish(seq)
                seq.finish_reason, seq.metrics.finish_time = reason, now
                ended.append(StepOutput(seq.request_id, seq.index, [], True, reason))
        return ended

    # ---- disaggregated prefill: the decode side's received requests --------------------------------
    def allocate_received(self, seq: Sequence) -> bool:
        """Reserve the blocks a received prompt's KV will be written into (seq.block_table); seq stays out of
        the queues until add_received. False when they do not fit now (decode steps free some)."""
        if not self.bm.can_reserve(seq, seq.num_prompt_tokens):
            return False
        self.bm.reserve(seq, seq.num_prompt_tokens)
        return True

    def add_received(self, seq: Sequence, first_token: int) -> StepOutput:
        """The prompt's KV is in seq's blocks: count it computed, join the running batch and append the first
        token (sampled by the prefill side). Returns its StepOutput (finished if that token ends it)."""
        seq.num_computed_tokens = seq.num_prompt_tokens
        seq.status = Status.RUNNING
        seq.metrics.first_scheduled_time = self.clock()
        self.running.append(seq)
        return self._append_token(seq, int(first_token), self.clock())

    def finish(self, seq: Sequence, free: bool = True) -> None:
        """Remove a finished or aborted sequence from whichever queue holds it and free its blocks
        (free=False: it keeps them, for a caller that frees them later, e.g. after shipping its KV)."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        if free:
            self.bm.free(seq)
        seq.status = Status.FINISHED

    def _budget(self, decode_tokens: int) -> Budget:
        return Budget(self.max_num_batched_tokens - decode_tokens, self.max_num_seqs - self._num_slots_used(), self.bm,
                      self.chunked_prefill)

    def _next_chunk(self, seq: Sequence, budget: Budget) -> int:
        """The tokens FCFS would give seq now: all it needs, or with chunked prefill what the budget has left."""
        return min(seq.num_uncomputed_tokens, budget.tokens) if self.chunked_prefill else seq.num_uncomputed_tokens

    def _check_progress(self, started: list[Sequence], decode_tokens: int) -> None:
        """The policy scheduled nothing and no decode runs: without a pick this step would do nothing, and
        every later one the same (a notebook would hang). That is the policy's fault, unless the cache is
        what stops the oldest started prompt (then the engine preempts); raise, naming the fault."""
        name = type(self.policy).__name__
        budget = self._budget(decode_tokens)
        if started:
            seq = started[0]
            n = self._next_chunk(seq, budget)
            if budget.fits(seq, n):
                raise RuntimeError(
                    f"scheduler policy {name} starved a started prompt: it scheduled nothing although nothing else "
                    f"runs and the next chunk of {seq!r} ({n} of its {seq.num_uncomputed_tokens} uncomputed tokens) "
                    "fits the budget. A prompt already being prefilled (candidate with is_waiting False) must get "
                    "its next chunk, or the engine never progresses")
        elif self.waiting:
            raise RuntimeError(
                f"scheduler policy {name} admitted nothing although nothing runs, the cache is empty and "
                f"{len(self.waiting)} request(s) wait (the first one fits the budget): the engine would never "
                "progress")

    def _num_slots_used(self) -> int:
        return sum(s.num_slots for s in self.running)

    def _check(self, decisions, candidates, decode_tokens) -> None:
        """A policy is user code: refuse decisions that break the engine's invariants, saying which."""
        allowed, seen = {id(s) for s in candidates}, set()
        tokens, slots, blocks = decode_tokens, self._num_slots_used(), 0
        for seq, n in decisions:
            if id(seq) not in allowed or id(seq) in seen:
                raise RuntimeError(f"scheduler policy returned {seq!r}, which is not a candidate or appears twice")
            seen.add(id(seq))
            if not isinstance(n, int) or not 0 < n <= seq.num_uncomputed_tokens:
                raise RuntimeError(f"scheduler policy gave {n!r} tokens to {seq!r}: need 1..{seq.num_uncomputed_tokens}")
            if not self.chunked_prefill and n != seq.num_uncomputed_tokens:
                raise RuntimeError(f"scheduler policy chunked {seq!r} ({n} tokens) but chunked prefill is off")
            tokens += n
            slots += seq.num_slots if seq.is_waiting else 0
            blocks += self.bm.blocks_needed(seq, n)
        if tokens > self.max_num_batched_tokens:
            raise RuntimeError(f"scheduler policy scheduled {tokens} tokens (decodes included) > max_num_batched_tokens={self.max_num_batched_tokens}")
        if slots > self.max_num_seqs:
            raise RuntimeError(f"scheduler policy admitted past max_num_seqs={self.max_num_seqs} ({slots} slots)")
        if blocks > self.bm.num_free():
            raise RuntimeError(f"scheduler policy needs {blocks} KV blocks, only {self.bm.num_free()} are free")
