"""Speculative decoding inside the engine: propose k draft tokens, verify them in the normal step, roll back.

    LLM(target, speculative_config={"model": draft_path, "num_speculative_tokens": 4})
    LLM(target, speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})

One LLMEngine.step() with speculation on:
  1. SpecDecoder.propose(): every running sequence past its prompt whose next forward is a single token
     gets up to k draft tokens from the proposer, a draft model (DraftModelProposer) or prompt lookup
     (NgramProposer). They are appended to seq.token_ids and seq.num_logits = k + 1. k is cut so the
     decode phase fits max_num_batched_tokens, the sequence never passes max_tokens or max_seq_len, and the
     draft model's cache has room; a sequence left with 0 drafts is a plain decode this step.
  2. scheduler.Scheduler puts a sequence past its prompt in the decode phase with all its uncomputed
     tokens (the last sampled one and the drafts), before the SchedulerPolicy runs: a policy only ever
     sees prompts (scheduler.py's docstring). The k + 1 tokens run as one ragged chunk (the prefill
     kernel: k + 1 queries against the cached context); StepStats count them as decode tokens.
  3. The forward gives the k + 1 logit rows (Sequence.num_logits); SpecDecoder.verify() hands them to
     the verifier (greedy, or the rejection sampler; pluggable, interfaces.SpeculativeVerifier), which
     returns the tokens to emit: the accepted drafts and one token of the target's own.
  4. Rollback (Scheduler.rollback, in Scheduler.update_from_output): the drafts leave token_ids and the
     emitted tokens are appended, num_computed_tokens counts the kept tokens only, and blocks past them go
     back to the pool (BlockManager.trim); the draft model's cache rolls back the same way (verify). A
     preempted sequence drops its drafts (discard) and recomputes like any other.

Randomness: a sampled request's draft draws and verifier draws all come from its own generator
(SamplingParams.seed), in step order, so a seeded request gives the same tokens alone or batched as long as
its drafts per step are the same (the token budget can cut them when many sequences decode at once; a
preemption discards drafts already drawn).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from .block_manager import BlockAllocator, BlockManager
from .engine_config import DraftClock, EngineConfig
from .engine_config import SpeculativeConfig as SpeculativeConfig  # its home was here: spec_decode.SpeculativeConfig
from .loader import load_model
from .model_runner import ModelRunner
from .sampling import SamplingParams, warp_logits
from .scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from .sequence import Sequence, Status

# -- verification: the engine's own verifier (interfaces.SpeculativeVerifier) ---------------------------


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> list[int]:
    """target_logits [k + 1, V] raw rows (row i scores draft i, row k the token after the last draft);
    draft_tokens [k]. Keep drafts while each equals its row's argmax (first index on ties, as the plain
    greedy sampler), then emit the argmax of the first row that disagrees, or of row k if none does.
    1 to k + 1 tokens, exactly the next tokens of plain greedy decoding."""
    best = target_logits.argmax(dim=-1).tolist()
    emitted = []
    for i, x in enumerate(draft_tokens.tolist()):
        emitted.append(best[i])
        if best[i] != x:
            return emitted
    emitted.append(best[-1])  # every draft kept: the last row gives one more (the bonus token)
    return emitted


def residual(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dim: what a rejected position samples from. Where p == q (the
    sum is 0, so no rejection can happen) it returns p, so every row stays a distribution."""
    excess = (target_probs - draft_probs).clamp(min=0)
    total = excess.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, excess / total.clamp(min=torch.finfo(excess.dtype).tiny), target_probs)


def verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
           generator: torch.Generator | None) -> list[int]:
    """The rejection sampler (Leviathan et al. 2023; Chen et al. 2023). target_probs [k + 1, V] (p_0 .. p_k),
    draft_probs [k, V] (q_i, which draft_tokens[i] was drawn from), draft_tokens [k].

    For each draft x in order: one u = torch.rand((), generator, dtype of p); keep x if u < p_i(x) / q_i(x)
    (probability min(1, p/q)); else emit one torch.multinomial draw from residual(p_i, q_i) and stop. All k
    kept: one torch.multinomial draw from p_k (the bonus). Those are all the draws, in that order (lesson
    14's contract, so a learner's verifier given the same generator emits the same tokens). Each emitted
    token is distributed exactly as the target samples it: min(p, q) from keeping plus max(0, p - q) from
    the residual add up to p."""
    emitted = []
    for i, x in enumerate(draft_tokens.tolist()):
        u = torch.rand((), generator=generator, dtype=target_probs.dtype, device=target_probs.device)
        if u < target_probs[i, x] / draft_probs[i, x]:
            emitted.append(x)
            continue
        emitted.append(int(torch.multinomial(residual(target_probs[i], draft_probs[i]), 1, generator=generator)))
        return emitted
    emitted.append(int(torch.multinomial(target_probs[-1], 1, generator=generator)))
    return emitted


class RejectionVerifier:
    """The engine's verifier: verify_greedy for temperature 0, the rejection sampler `verify` otherwise.
    Any object with these two methods (a module too) plugs in as speculative_config["verifier"]."""

    verify_greedy = staticmethod(verify_greedy)
    verify = staticmethod(verify)


def sampling_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [n, V] raw rows of one sequence -> [n, V] float64: the distribution its sampler draws from
    (temperature, top-k, top-p as sampling.warp_logits), softmax taken in float64 so p / q ratios of rare
    tokens stay exact enough."""
    return warp_logits(logits, [params] * logits.shape[0]).double().softmax(dim=-1)


# -- proposers ---------------------------------------------------------------------------------------------

Proposal = tuple[list[int], "torch.Tensor | None"]  # drafts, and [len, V] the distribution each was drawn from (None: argmax or point mass)


class NgramProposer:
    """Prompt lookup (vLLM's "ngram" method): find the longest n-gram, prompt_lookup_min <= n <=
    prompt_lookup_max, that ends the sequence and occurs earlier in it (prompt and output), take its earliest
    occurrence, and propose the (up to k) tokens that followed it. No model, no randomness: as a
    distribution the proposal is a point mass, so the rejection sampler keeps draft x with probability p(x)."""

    def __init__(self, prompt_lookup_max: int, prompt_lookup_min: int):
        self.n_max, self.n_min = prompt_lookup_max, prompt_lookup_min

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        size = len(token_ids)
        if k < 1 or size < 2:
            return []
        t = torch.tensor(token_ids)
        for n in range(min(self.n_max, size - 1), self.n_min - 1, -1):
            # windows start at i = 0 .. size - 1 - n: occurrences that end before the last token, so at
            # least one token follows each (the suffix itself is not an occurrence)
            hits = (t[:-1].unfold(0, n, 1) == t[size - n:]).all(dim=1).nonzero()
            if len(hits):
                start = int(hits[0]) + n
                return token_ids[start:start + k]
        return []

    def max_drafts(self, seq: Sequence) -> int:
        return 1 << 30

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        return [(self.lookup(s.token_ids, k), None) for s, k in zip(seqs, ks)]

    def rollback(self, seq: Sequence, num_kept: int) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        pass

    def check_consistency(self) -> None:
        pass


class _DraftSeq:
    """The draft model's view of one sequence, shaped like a Sequence for ModelRunner and BlockManager:
    token_ids (the target's, plus this step's drafts), num_computed_tokens in the draft's cache, block_table."""

    num_logits = 1

    def __init__(self, seq: Sequence):
        self.seq, self.token_ids, self.num_computed_tokens, self.block_table = seq, [], 0, []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class DraftModelProposer:
    """A smaller model with the same vocabulary drafts k tokens, one batched forward per draft position.

    Its KV cache: its own paged pool (a ModelRunner and a BlockManager over its own BlockAllocator) with the
    engine's block size, num_blocks = the target's plus room for k more tokens per running sequence. Each
    sequence gets a _DraftSeq on its first proposal; the draft catches up on whatever it has not computed
    (the whole prompt the first time, after that the target's last token, and the last draft when all were
    kept) in the first forward of the next proposal. Rolled back with the target; freed when the sequence
    finishes, is aborted or is preempted. A sequence whose catch-up finds no free draft block gets no
    drafts that step (nothing waits or fails for the draft).

    Draws: a greedy request's drafts are the draft model's argmax; a sampled one draws each draft from the
    draft's distribution under the request's own temperature / top-k / top-p, with the request's generator.
    On a sim.gpu_model.ModeledClock each draft forward is priced by clock.advance_draft (at the clock's
    draft_shape; without one it is counted, not priced).
    """

    def __init__(self, path, *, device, dtype, backend, block_size: int, num_blocks: int, vocab_size: int,
                 max_len: int, clock=None):
        self.config, model, _ = load_model(path, device, dtype)
        if self.config.vocab_size != vocab_size:
            raise ValueError(f"the draft model {path} has vocab_size {self.config.vocab_size}, the target "
                             f"{vocab_size}: drafts must be token ids of the target's vocabulary (same tokenizer)")
        self.block_size, self.max_len = block_size, min(max_len, self.config.max_model_len)
        self.runner = ModelRunner(model, block_size, num_blocks, device, dtype, backend)
        self.bm = BlockManager(BlockAllocator(num_blocks), block_size, num_blocks)
        self.states: dict[int, _DraftSeq] = {}
        self.clock = clock

    def max_drafts(self, seq: Sequence) -> int:
        """Drafts the draft model's positions allow: it computes N + k - 1 tokens for k drafts after N."""
        return self.max_len - seq.num_tokens + 1

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        states = []
        for seq in seqs:
            st = self.states.setdefault(seq.seq_id, _DraftSeq(seq))
            st.token_ids = list(seq.token_ids)  # its computed tokens are a prefix of these (rollback keeps it so)
            states.append(st)
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        live = [i for i, k in enumerate(ks) if k > 0]
        while live:
            batch = []
            for i in live:  # reserve one by one: each reservation shrinks what the next can take
                n = states[i].num_tokens - states[i].num_computed_tokens
                if self.bm.can_reserve(states[i], n):
                    self.bm.reserve(states[i], n)
                    batch.append(i)
            if not batch:
                break
            one = [i for i in batch if states[i].num_tokens - states[i].num_computed_tokens == 1]
            more = [i for i in batch if states[i].num_tokens - states[i].num_computed_tokens > 1]
            so = SchedulerOutput(
                decodes=[ScheduledSeq(states[i], 1) for i in one],
                prefills=[ScheduledSeq(states[i], states[i].num_tokens - states[i].num_computed_tokens) for i in more])
            if isinstance(self.clock, DraftClock):  # modeled GPU time: read before num_computed_tokens moves
                self.clock.advance_draft(so)
            rows = self.runner.execute(so)  # one row per sequence, in so.scheduled order: one + more
            for i, row in zip(one + more, rows):
                st, params = states[i], seqs[i].params
                st.num_computed_tokens = st.num_tokens
                if params.greedy:
                    x = int(row.argmax())
                else:
                    q = sampling_distribution(row[None], params)[0]
                    x = int(torch.multinomial(q, 1, generator=seqs[i].generator))
                    probs[i].append(q)
                st.token_ids.append(x)  # the last draft is never fed: the target's verdict comes first
                drafts[i].append(x)
            live = [i for i in batch if len(drafts[i]) < ks[i]]
        return [(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs)]

    def rollback(self, seq: Sequence, num_kept: int) -> None:
        """The target kept num_kept tokens: the draft's cache keeps at most those (its last draft never was
        in it) and frees the blocks past them."""
        st = self.states.get(seq.seq_id)
        if st is not None:
            st.num_computed_tokens = min(st.num_computed_tokens, num_kept)
            del st.token_ids[st.num_computed_tokens:]
            self.bm.trim(st)

    def release(self, seq: Sequence) -> None:
        st = self.states.pop(seq.seq_id, None)
        if st is not None:
            self.bm.free(st)

    def check_consistency(self) -> None:
        """The draft pool's invariants (BlockManager.check_consistency) over the live draft states."""
        self.bm.check_consistency(list(self.states.values()))


# -- the engine's side ------------------------------------------------------------------------------------


@dataclass
class _Drafts:
    seq: Sequence
    tokens: list[int]
    probs: torch.Tensor | None  # [k, V] q rows for a sampled request from a draft model, else None


class SpecDecoder:
    """What LLMEngine calls when speculative_config is set (see the module docstring for the step's order).
    config: the engine's resolved EngineConfig (its speculative part, the sizes the draft model's cache
    shares, the budget, the clock); scheduler: whose running sequences get drafts and which rolls them back;
    backend: the attention backend the draft model runs on; vocab_size: the target's."""

    def __init__(self, config: EngineConfig, scheduler: Scheduler, backend, vocab_size: int):
        spec, cache = config.speculative, config.cache
        self.config, self.k = spec, spec.num_speculative_tokens
        self.verifier = spec.verifier if spec.verifier is not None else RejectionVerifier()
        self.scheduler, self.vocab_size = scheduler, vocab_size
        self.max_seq_len, self.token_budget = config.scheduler.max_seq_len, config.scheduler.max_num_batched_tokens
        if spec.method == "ngram":
            self.proposer = NgramProposer(spec.prompt_lookup_max, spec.prompt_lookup_min)
        else:
            extra = config.scheduler.max_num_seqs * (-(-self.k // cache.block_size) + 1)  # k tokens of lookahead each
            self.proposer = DraftModelProposer(
                spec.model, device=config.model.device, dtype=config.model.dtype, backend=backend,
                block_size=cache.block_size, num_blocks=cache.num_blocks + extra, vocab_size=vocab_size,
                max_len=self.max_seq_len, clock=config.clock)
        self.pending: dict[int, _Drafts] = {}  # seq_id -> drafts appended and not yet verified
        self.step_counts = self._zero()

    @staticmethod
    def _zero() -> dict:
        return {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}

    def take_step_counts(self) -> dict:
        """This step's counts for StepStats (verifications, drafts verified, drafts accepted); resets them."""
        counts, self.step_counts = self.step_counts, self._zero()
        return counts

    def has_drafts(self, seq: Sequence) -> bool:
        return seq.seq_id in self.pending

    def propose(self) -> None:
        """Append drafts to the running sequences that decode next (oldest first, as the token budget allows)."""
        phase = [s for s in self.scheduler.running if s.in_decode_phase]
        spare = self.token_budget - sum(s.num_uncomputed_tokens for s in phase)  # what the decode phase leaves
        seqs, ks = [], []
        for s in phase:
            if s.num_uncomputed_tokens != 1 or s.in_prefill or s.seq_id in self.pending:
                continue
            # k + 1 tokens may come out of this step: stay within max_tokens and the cache (max_seq_len)
            k = min(self.k, spare, s.params.max_tokens - s.num_output_tokens - 1,
                    self.max_seq_len - s.num_tokens - 1, self.proposer.max_drafts(s))
            if k > 0:
                seqs.append(s)
                ks.append(k)
                spare -= k
        for s, (tokens, probs) in zip(seqs, self.proposer.propose(seqs, ks)):
            if tokens:
                s.token_ids += tokens
                s.num_logits = len(tokens) + 1
                self.pending[s.seq_id] = _Drafts(s, tokens, probs)

    def verify(self, seq: Sequence, rows: torch.Tensor) -> list[int]:
        """rows [k + 1, V]: the target's raw logits at the last sampled token and the k drafts. Returns the
        tokens to emit (the kept drafts, then the target's own token); the draft model's cache rolls back to
        the kept ones here, the sequence in Scheduler.update_from_output (Scheduler.rollback)."""
        d = self.pending.pop(seq.seq_id)
        k = len(d.tokens)
        drafts = torch.tensor(d.tokens, dtype=torch.long, device=rows.device)
        if seq.params.greedy:
            emitted = self.verifier.verify_greedy(rows.clone(), drafts.clone())
        else:
            p = sampling_distribution(rows, seq.params)
            q = d.probs if d.probs is not None else torch.nn.functional.one_hot(drafts, rows.shape[-1]).to(p.dtype)
            emitted = self.verifier.verify(p, q.to(p.device), drafts.clone(), seq.generator)
        emitted = self._checked(emitted, d.tokens)
        kept = len(emitted) - 1
        self.proposer.rollback(seq, seq.num_tokens - k + kept)  # the tokens before the drafts, and the kept ones
        m = seq.metrics
        m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens = m.num_drafts + 1, m.num_draft_tokens + k, m.num_accepted_tokens + kept
        c = self.step_counts
        c["num_drafts"], c["num_draft_tokens"], c["num_accepted_tokens"] = c["num_drafts"] + 1, c["num_draft_tokens"] + k, c["num_accepted_tokens"] + kept
        return emitted

    def _checked(self, emitted, drafts: list[int]) -> list[int]:
        """A verifier is user code: its answer must be 1 .. k + 1 token ids, all but the last the drafts in
        order (the cache holds the drafts' K/V at those positions), the last one in the vocabulary."""
        name = type(self.verifier).__name__
        try:
            emitted = [operator.index(t) if not isinstance(t, torch.Tensor) else int(t.item()) for t in emitted]
        except (TypeError, ValueError, RuntimeError):
            raise RuntimeError(f"verifier {name} returned {emitted!r}: expected a list of Python int token ids") from None
        k = len(drafts)
        if not 1 <= len(emitted) <= k + 1:
            raise RuntimeError(f"verifier {name} returned {len(emitted)} tokens for {k} drafts: a step emits 1 to "
                               f"k + 1 = {k + 1} (the kept drafts, then one token of the target's own)")
        if emitted[:-1] != drafts[:len(emitted) - 1]:
            raise RuntimeError(f"verifier {name} returned {emitted} for drafts {drafts}: every token before the last "
                               "must be a kept draft, in order (stop at the first rejection, then emit one token)")
        if not 0 <= emitted[-1] < self.vocab_size:
            raise RuntimeError(f"verifier {name} emitted token {emitted[-1]}, outside the vocabulary [0, {self.vocab_size})")
        return emitted

    def discard(self, seq: Sequence) -> None:
        """A preempted sequence: its unverified drafts leave token_ids (it recomputes the rest) and the draft
        model's cache for it is freed."""
        d = self.pending.pop(seq.seq_id, None)
        if d is not None:
            self.scheduler.rollback(seq, len(d.tokens))
        self.proposer.release(seq)

    def collect(self) -> None:
        """Free what belongs to sequences that no longer run (finished, aborted; preempted ones went through
        discard already)."""
        for d in list(self.pending.values()):
            if d.seq.status is not Status.RUNNING:
                self.discard(d.seq)
        for st in list(getattr(self.proposer, "states", {}).values()):
            if st.seq.status is not Status.RUNNING:
                self.proposer.release(st.seq)
