"""LLMEngine: the step API. add_request() queues, step() runs one scheduler iteration + one forward.

The shape is vLLM v1's (vllm/v1/engine/core.py): the arguments become one EngineConfig (engine_config.py),
checked once; the parts are built from it (block manager, scheduler, runner, speculative decoder), and a step
is schedule -> execute -> sample/verify -> Scheduler.update_from_output, the scheduler alone editing its
queues and the sequences' bookkeeping."""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import NamedTuple

import torch

from .attention import TritonBackend, get_backend
from .block_manager import BlockAllocator
from .cuda_graphs import MAX_CAPTURE_SIZE, TorchCUDAGraph
from .engine_config import EngineConfig, StepClock
from .loader import load_config, load_model
from .model_runner import ModelRunner
from .prefix_cache import PrefixCacheStats, make_block_manager
from .quantization import Fp8KVBackend, quantize_model
from .sampling import SamplingParams, StopStrings, make_generator, process_logits, sample_isolated
from .scheduler import SampledTokens, SamplerOutput, ScheduledSeq, Scheduler, SchedulerOutput
from .sequence import RequestMetrics, RequestOutput, Sequence, Status, StepOutput, StepStats, request_output
from .spec_decode import SpecDecoder


class _Rows(NamedTuple):
    """A forward's logits [rows, vocab] and the same split per scheduled chunk (views, one per chunk)."""
    logits: torch.Tensor
    split: tuple[torch.Tensor, ...]


def cuda_graph_class(cfg: EngineConfig, backend):
    """cuda_graphs.TorchCUDAGraph where decode steps are captured: on CUDA, one rank, the Triton backend (the
    default there; not a learner's backend or the fp8 cache's wrapper), enforce_eager off. None: run eagerly."""
    m = cfg.model
    if m.enforce_eager or m.device.type != "cuda" or cfg.parallel.tensor_parallel_size > 1 or \
            not isinstance(backend, TritonBackend):
        return None
    return TorchCUDAGraph


class LLMEngine:
    """One process, one model, one paged KV cache. Arguments as vLLM names them (engine_config.py holds
    them, in vLLM's parts, and checks them), plus:
    num_blocks (KV blocks of block_size tokens; default: kv_cache_memory_bytes, or 512 MiB on CPU /
    80% of free GPU memory, capped at max_num_seqs full-length sequences), block_allocator /
    scheduler_policy / attention_backend (the hooks in interfaces.py), clock (timestamps; engine_config.Clock,
    or a StepClock told about each step, as sim.gpu_model.ModeledClock).
    speculative_config: vLLM's dict, {"model": draft_dir, "num_speculative_tokens": k} or {"method": "ngram",
    "num_speculative_tokens": k, "prompt_lookup_max": n}, optionally "verifier" (interfaces.SpeculativeVerifier);
    see spec_decode.py.
    enable_prefix_caching (vLLM's name; default False): full KV blocks stay cached after their request and
    later requests starting with the same tokens skip computing them; prefix_cache: the cache to use, a
    class or callable block_size -> interfaces.PrefixCache (default prefix_cache.HashPrefixCache).
    quantization (None, "int8", "int4" or "fp8") and kv_cache_dtype ("auto" or "fp8"): see quantization.py;
    with an fp8 cache a block takes half the bytes, so the same budget holds twice the blocks.
    tensor_parallel_size (default 1): shard the model over that many worker processes (tp_runner.py; one GPU
    each on CUDA); this process keeps the scheduler and holds no weights (self.model is None), and
    kv_cache_memory_bytes is then per rank, as vLLM's memory budget is per GPU. Call shutdown() to stop them
    early (they also stop when the engine is collected or the process exits).
    config: an engine_config.EngineConfig instead of the keywords (not both).

    The parts, each given the config and what it needs: block_manager (the KV blocks), scheduler (the only
    owner of the queues), runner (the forward; TPModelRunner across processes), spec (SpecDecoder, or None).
    engine_config is the config resolved for the loaded model; self.config is the model's config.json.

    Trace replay: add_request(prompt, params, arrival_time=t) as requests arrive, step() in a loop
    while has_unfinished(); each finished request's RequestOutput comes in a StepOutput.output.
    """

    def __init__(self, model, *, config: EngineConfig | None = None, **kwargs):
        if config is not None and kwargs:
            raise TypeError(f"LLMEngine takes config= or keyword arguments, not both: got config and {sorted(kwargs)}")
        config = config if config is not None else EngineConfig.from_kwargs(**kwargs)
        t_load = time.perf_counter()
        self.config, self.model, self.tokenizer = _load(model, config)
        # Seconds spent loading (config, weights, tokenizer) and allocating the KV cache; startup.py reports them.
        self.init_times = {"load_model": time.perf_counter() - t_load}
        self.engine_config = cfg = config.resolve(self.config)
        # The settings as attributes, as earlier readers know them (max_seq_len is the scheduler's).
        self.device, self.dtype, self.quantization = cfg.model.device, cfg.model.dtype, cfg.model.quantization
        self.kv_cache_dtype, self.tensor_parallel_size = cfg.kv_cache_dtype, cfg.parallel.tensor_parallel_size
        self.clock, self.block_size, self.num_blocks = cfg.clock, cfg.cache.block_size, cfg.cache.num_blocks
        self._checked_clock, self._step_clock = None, False  # see _is_step_clock
        self.max_model_len, self.max_num_seqs = cfg.model.max_model_len, cfg.scheduler.max_num_seqs
        self.max_num_batched_tokens = cfg.scheduler.max_num_batched_tokens
        c = cfg.cache
        self.block_manager = make_block_manager((c.block_allocator or BlockAllocator)(c.num_blocks), c.block_size,
                                                c.num_blocks, c.enable_prefix_caching, c.prefix_cache)
        self.scheduler = Scheduler(cfg, self.block_manager, self.config.eos_token_ids, self.tokenizer)
        self.backend = get_backend(cfg.model.attention_backend, self.device, c.block_size)
        if self.kv_cache_dtype.itemsize == 1:  # fp8 cache: quantize on write, dequantize on read
            self.backend = Fp8KVBackend(self.backend)
        self.runner = self._make_runner(model, cfg)
        self.spec = None if cfg.speculative is None else SpecDecoder(cfg, self.scheduler, self.backend,
                                                                      self.config.vocab_size)
        self.requests: dict[str, list[Sequence]] = {}
        self.step_stats: list[StepStats] = []
        self._ids, self._seq_ids = itertools.count(), itertools.count()
        self._aborted: list[StepOutput] = []  # aborts since the last step(), which reports them
        # request id -> the exception that ended it, for each request the last step() finished with "error"
        self.step_errors: dict[str, BaseException] = {}

    def _make_runner(self, model, cfg: EngineConfig):
        """The forward and the KV cache: a ModelRunner here, or TPModelRunner's worker processes (their
        start-up, imports, weights, KV cache, all ranks at once, timed as tp_workers)."""
        t_kv = time.perf_counter()
        graph_class = cuda_graph_class(cfg, self.backend)
        if cfg.parallel.tensor_parallel_size == 1:
            runner = ModelRunner(self.model, cfg.cache.block_size, cfg.cache.num_blocks, self.device, self.dtype,
                                 self.backend, cache_dtype=self.kv_cache_dtype, null_block=graph_class is not None)
            if graph_class is not None:
                t_graphs = time.perf_counter()
                largest = min(cfg.scheduler.max_num_seqs, cfg.model.max_cudagraph_capture_size or MAX_CAPTURE_SIZE)
                runner.capture_decode_graphs(largest, -(-cfg.scheduler.max_seq_len // cfg.cache.block_size), graph_class)
                self.init_times["cuda_graphs"] = time.perf_counter() - t_graphs
                t_kv += self.init_times["cuda_graphs"]
        else:
            from .tp_runner import TPModelRunner

            runner = TPModelRunner(model, cfg)
            self.init_times["tp_workers"], t_kv = time.perf_counter() - t_kv, time.perf_counter()
        runner.clock = self.clock  # StepStats.forward_time on the same clock as wall_time
        self.init_times["kv_allocation"] = time.perf_counter() - t_kv
        return runner

    @property
    def max_seq_len(self) -> int:
        """The longest sequence served: the model's limit, or what the KV cache holds if less (a sequence alone
        in the cache must always fit, so preemption never deadlocks). A sequence this long ends ("length")."""
        return self.scheduler.max_seq_len

    @max_seq_len.setter
    def max_seq_len(self, n: int) -> None:  # a timing-only engine lifts it to what its blocks hold (lesson 17)
        self.scheduler.max_seq_len = n

    def kv_bytes_per_token_per_rank(self) -> int:
        """KV-cache bytes one token takes on one rank: its KV heads only (all of them at tensor_parallel_size 1)."""
        return self.engine_config.kv_bytes_per_token_per_rank(self.config)

    def kv_cache_bytes_per_rank(self) -> list[int]:
        """Bytes each rank's K and V caches actually allocated (one entry at tensor_parallel_size 1)."""
        if hasattr(self.runner, "kv_cache_bytes"):
            return list(self.runner.kv_cache_bytes)
        return [self.runner.k_cache.nbytes + self.runner.v_cache.nbytes]

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do at tensor_parallel_size 1); the engine is unusable after."""
        if hasattr(self.runner, "shutdown"):
            self.runner.shutdown()

    # ---- requests -------------------------------------------------------------------------------
    def validate(self, prompt, params: SamplingParams) -> list[int]:
        """Check a request without queueing it; returns the prompt's token ids."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if params.n > self.max_num_seqs:
            raise ValueError(f"SamplingParams.n={params.n} exceeds max_num_seqs={self.max_num_seqs}")
        if params.logit_bias and max(params.logit_bias) >= self.config.vocab_size:
            bad = sorted(t for t in params.logit_bias if t >= self.config.vocab_size)[:5]
            raise ValueError(f"SamplingParams.logit_bias={bad}: token ids outside the vocabulary "
                             f"[0, {self.config.vocab_size})")
        if params.stop and self.tokenizer is None:
            raise ValueError("SamplingParams.stop: stop strings need the model directory's tokenizer.json")
        if self.spec is not None and (params.processes_logits or params.prompt_logprobs is not None):
            raise ValueError("SamplingParams: penalties, logit_bias, min_tokens and prompt_logprobs are not "
                             "supported with speculative decoding")
        return self.tokenize(prompt)

    def tokenize(self, prompt) -> list[int]:
        """A string (needs tokenizer.json) or a list of token ids -> validated token ids."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("string prompt given but the model directory has no tokenizer.json: pass token ids")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise TypeError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt is empty: give at least one token")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"prompt holds token ids outside the vocabulary [0, {self.config.vocab_size}): {bad[:5]}")
        if len(ids) >= self.max_seq_len:
            limit = "the KV cache holds only num_blocks * block_size" if self.max_seq_len < self.max_model_len else \
                "the model's context limit (max_position_embeddings, or sliding_window / max_model_len if smaller)"
            raise ValueError(f"prompt has {len(ids)} tokens; at most {self.max_seq_len - 1} fit, since {limit} is "
                             f"{self.max_seq_len} tokens and at least one must be generated: shorten the prompt")
        return ids

    def add_request(self, prompt, params: SamplingParams | None = None, request_id: str | None = None,
                    arrival_time: float | None = None, hold_kv: bool = False,
                    output_prefix: list[int] | None = None) -> str:
        """Queue a request; arrival_time (engine clock) is recorded as given, admission is not delayed.
        hold_kv (disaggregated prefill, disagg.py): when the request finishes, its sequence keeps its KV blocks
        until release_kv(seq); the caller must keep the Sequence (self.requests[request_id][0]) to do so.
        output_prefix: tokens this request already generated (a continuation after an abort): they count as
        output (max_tokens, min_tokens, the penalties) and are not searched for stop strings again; they are
        computed with the prompt, and the outputs report only tokens generated from now on (the final
        CompletionOutput's token_ids and text include the prefix)."""
        seq = self._new_sequence(prompt, params, request_id, arrival_time, hold_kv, list(output_prefix or []))
        self.requests[seq.request_id] = [seq]
        self.scheduler.add(seq)
        return seq.request_id

    def _new_sequence(self, prompt, params: SamplingParams | None, request_id, arrival_time: float | None,
                      hold_kv: bool = False, prefix: list[int] = ()) -> Sequence:
        """A checked request's Sequence, in no queue yet."""
        params = params if params is not None else SamplingParams()
        if hold_kv and params.n != 1:
            raise ValueError("hold_kv needs SamplingParams.n == 1: forked samples share blocks")
        ids = self.validate(prompt, params)
        if prefix:
            self._check_prefix(ids, prefix, params, hold_kv)
        request_id = self._request_id(request_id)
        metrics = RequestMetrics(arrival_time=self.clock() if arrival_time is None else arrival_time)
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.scheduler.eos)
        seq = Sequence(next(self._seq_ids), request_id, ids, params, metrics,
                       make_generator(params.seed, 0, self.device), stop_ids=stop_ids)
        seq.hold_kv = hold_kv
        if prefix:
            seq.token_ids += prefix
            seq.prefill_until = seq.num_tokens
            if seq.stop_strings is not None:
                seq.stop_strings = StopStrings(params.stop, params.include_stop_str_in_output, params.min_tokens,
                                               self.tokenizer.decode(prefix))
            if seq.logprobs is not None:
                seq.logprobs = [None] * len(prefix)  # not known here: computed by the request that sampled them
        if params.prompt_logprobs is not None:
            seq.num_logits = len(ids)  # every prompt position's row (the scheduler then skips the prefix cache)
        return seq

    def _check_prefix(self, ids: list[int], prefix: list[int], params: SamplingParams, hold_kv: bool) -> None:
        if params.n != 1 or hold_kv or params.prompt_logprobs is not None:
            raise ValueError("output_prefix needs SamplingParams.n == 1, no prompt_logprobs and no hold_kv")
        self.tokenize(ids + prefix)  # the same checks as a prompt: ids in the vocabulary, room to generate
        if len(prefix) >= params.max_tokens:
            raise ValueError(f"output_prefix has {len(prefix)} tokens: max_tokens={params.max_tokens} leaves "
                             "nothing to generate")

    def _request_id(self, request_id) -> str:
        """The caller's id (refused if in use), or the next free number."""
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self.requests:  # skip ids a caller chose by hand
                request_id = str(next(self._ids))
        request_id = str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request wherever it is (waiting or running); its blocks return to the pool. Returns its
        RequestOutput (finish_reason "abort"), which the next step() also reports, in a StepOutput per aborted
        sequence (as vLLM finishes an aborted stream). Unknown or finished ids are ignored (None)."""
        if request_id not in self.requests:
            return None
        seqs = self.requests.pop(request_id)
        ended = self.scheduler.finish_request(seqs, "abort")
        if self.spec is not None:
            self.spec.collect()  # unverified drafts leave the output; the draft model's cache is freed
        output = request_output(seqs, self.tokenizer)
        if ended:
            ended[-1].output = output
        self._aborted += ended  # the next step() reports them, so a stream() or step loop over them ends
        return output

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- disaggregated prefill/decode (disagg.py, kv_transfer.py) -----------------------------------
    def release_kv(self, seq: Sequence) -> None:
        """Prefill side: free the blocks a finished hold_kv sequence kept (once its KV is shipped or dropped)."""
        if seq.status is not Status.FINISHED:
            raise RuntimeError(f"release_kv({seq!r}): the sequence has not finished; abort() frees a live one")
        self.block_manager.free(seq)

    def allocate_received(self, request_id: str, prompt, params: SamplingParams,
                          arrival_time: float | None = None) -> Sequence | None:
        """Decode side: a Sequence for a request whose prompt was prefilled elsewhere, holding the blocks its
        prompt's KV will be written into (seq.block_table), outside the scheduler's queues until admit_received
        (Scheduler.allocate_received). None when the blocks do not fit now (decode steps free some; try again)."""
        params = params if params is not None else SamplingParams()
        if params.n != 1 or self.spec is not None:
            raise ValueError("a received request needs SamplingParams.n == 1 and no speculative decoding here")
        seq = self._new_sequence(prompt, params, str(request_id), arrival_time)  # built as any request is
        return seq if self.scheduler.allocate_received(seq) else None

    def admit_received(self, seq: Sequence, first_token: int) -> StepOutput:
        """Decode side: the prompt's KV is in seq's blocks. Count the prompt as computed, append the first
        token (sampled by the prefill instance) and join the running batch (Scheduler.add_received); the next
        step decodes it. Returns the first token's StepOutput (finished already if that token ends the request)."""
        self.requests[seq.request_id] = [seq]
        return self._with_request_outputs([self.scheduler.add_received(seq, first_token)])[0]

    def free_received(self, seq: Sequence) -> None:
        """Decode side: drop a received sequence before admit_received (its transfer was aborted)."""
        self.block_manager.free(seq)

    # ---- the step: schedule -> execute -> sample/verify -> update ----------------------------------
    def step(self) -> list[StepOutput]:
        """Schedule, run one forward over every scheduled token, sample (or verify drafts), and let the
        scheduler apply the result (Scheduler.update_from_output), as vLLM v1's EngineCore.step. Returns one
        StepOutput per sequence that got new tokens, preceded by one (no new token, finish_reason "abort") per
        sequence aborted since the previous step.

        Logits: each sequence's next token is sampled from the row of its last token. A sequence that set
        Sequence.num_logits = m > 1 (say m = k + 1 after appending k draft tokens, to verify them) also gets
        all m rows, for its last m tokens, in its StepOutput.logits [m, vocab]; the sampled token comes from
        the last of them (so it follows the drafts) and num_logits goes back to 1. The rows equal a plain
        forward over the same tokens. A verifier turns them into the sampler's distributions with
        sampling.sampling_probs and decides which drafts to keep.

        With speculative_config the engine does that itself (spec_decode.py): drafts are proposed before
        scheduling, verified after the forward, and a sequence's StepOutput carries every token it emitted.

        A request whose own sampling fails (sampling.sample_isolated: a NaN distribution, parameters the
        sampler cannot take) ends alone: its sequences get a StepOutput with finish_reason "error", its blocks
        are freed, step_errors[request_id] holds the exception until the next step(), and every other request
        in the batch goes on exactly as it would have. A failing forward pass still raises (it is the batch's).
        """
        outputs, self._aborted, self.step_errors = self._aborted, [], {}
        t0 = self.clock()
        so = self._schedule(t0)
        updated: list[StepOutput] = []
        if so.scheduled:
            in_prefill = [s.seq.in_prefill for s in so.scheduled]  # before num_computed_tokens moves on
            rows, forward_time = self._execute(so)
            updated = self.scheduler.update_from_output(so, self._sample(so, rows))
            self._record_stats(so, t0, in_prefill, forward_time)
        elif so.preempted:
            self._record_stats(so, t0, [])
        if self.spec is not None:
            self.spec.collect()  # before the outputs: an ended request's unverified drafts leave it
        return outputs + self._with_request_outputs(updated)

    def _schedule(self, now: float) -> SchedulerOutput:
        """Drafts first (speculative decoding), then the scheduler's batch; a preempted sequence's drafts go."""
        if self.spec is not None:
            self.spec.propose()
        so = self.scheduler.schedule(now)
        if self.spec is not None:
            for seq in so.preempted:
                self.spec.discard(seq)  # it recomputes; the drafts go
        return so

    def _execute(self, so: SchedulerOutput) -> tuple[_Rows, float | None]:
        """The forward over every scheduled token: per chunk its logit rows, and the forward's seconds (on a
        StepClock that models time, the modeled kernels rather than this CPU's forward)."""
        if so.block_copies:
            self.runner.copy_blocks(so.block_copies)
        # the modeled step's cost is read from the schedule here, before num_computed_tokens moves on
        modeled = self.clock.advance(so) if self._is_step_clock() else None
        logits = self.runner.execute(so)
        rows = _Rows(logits, logits.split([s.num_logits for s in so.scheduled]))
        return rows, self.runner.last_forward_time if modeled is None else modeled.time_s - modeled.overhead_s

    def _is_step_clock(self) -> bool:
        """isinstance(self.clock, StepClock), checked once per clock (a runtime protocol check walks the
        protocol's attributes: host time on every step)."""
        if self._checked_clock is not self.clock:
            self._checked_clock, self._step_clock = self.clock, isinstance(self.clock, StepClock)
        return self._step_clock

    # ---- sampling and verification ----------------------------------------------------------------
    def _sample(self, so: SchedulerOutput, rows) -> SamplerOutput:
        """One token for each sequence whose chunk reached its last token, from the last row; the rows of a
        sequence asking for num_logits > 1 are kept across its chunks until then, and returned with its token.
        Sequences with drafts get the verifier's tokens instead; a prompt just computed with n > 1 forks first."""
        out, chunks, verify = SamplerOutput(), [], []
        last = -1  # the row in rows.logits of s's last token
        for s, r in zip(so.scheduled, rows.split):
            seq = s.seq
            last += s.num_logits
            if not s.num_logits:
                continue
            if seq.num_logits > 1:
                seq.kept_logits.append(r)
                if not s.samples:  # not the last chunk: the rest come later
                    continue
                r, seq.kept_logits, seq.num_logits = torch.cat(seq.kept_logits), [], 1
            if self.spec is not None and self.spec.has_drafts(seq):
                verify.append((seq, r))
                continue
            group = [seq]
            if seq.pending_forks:
                group += self._fork(seq)
                out.forks.append((seq, group[1:]))
            chunks += [(g, r, last) for g in group]
        if chunks:
            self._sample_tokens(chunks, rows.logits, out)
        out.verified = [self._verify(seq, r) for seq, r in verify]  # after sampling: the global RNG's order
        return out

    def _sample_tokens(self, chunks: list[tuple[Sequence, torch.Tensor, int]], all_logits: torch.Tensor,
                       out: SamplerOutput) -> None:
        """Sample each (sequence, its rows, the index of its last row in all_logits) from that last row, a
        failing row ending its request alone."""
        seqs = [seq for seq, _, _ in chunks]
        last_rows = [i for _, _, i in chunks]
        logits = all_logits.index_select(0, torch.tensor(last_rows, device=all_logits.device))
        params = [s.params for s in seqs]
        failed: dict[int, Exception] = {}
        try:
            processed = process_logits(logits, params, [s.token_ids for s in seqs], [s.num_prompt_tokens for s in seqs],
                                       [s.stop_ids for s in seqs])
        except Exception as e:  # a bug: the rows that needed processing fail alone
            failed = {i: e for i, p in enumerate(params) if p.processes_logits}
            processed = logits
        tokens, sample_failed = sample_isolated(processed, params, [s.generator for s in seqs])
        failed.update(sample_failed)
        for i, e in sorted(failed.items()):
            rid = seqs[i].request_id
            if rid not in self.step_errors:
                self.step_errors[rid] = e
                out.failed[rid] = (e, self.requests[rid])
        prompt_lps: dict[str, list] = {}  # request id -> its prompt logprobs (computed once for n samples)
        for (seq, rows, i), tok in zip(chunks, tokens.tolist()):
            if seq.request_id not in self.step_errors:
                out.sampled.append(self._sampled(seq, rows, all_logits, i, tok, prompt_lps))

    def _sampled(self, seq: Sequence, rows: torch.Tensor, all_logits: torch.Tensor, i: int, token: int,
                 prompt_lps: dict[str, list]) -> SampledTokens:
        """seq's sampled token with what the request asks for beside it: its raw logprobs, its prompt's
        (prompt_lps caches them per request), the rows it asked for. all_logits[i] is its last row."""
        t = SampledTokens(seq, [token], logits=rows if rows.shape[0] > 1 else None)
        if seq.params.prompt_logprobs is not None and seq.prompt_logprobs is None:
            if seq.request_id not in prompt_lps:
                prompt_lps[seq.request_id] = _prompt_logprobs(rows if rows.shape[0] > 1 else all_logits[i:i + 1],
                                                              seq.token_ids[:seq.num_prompt_tokens],
                                                              seq.params.prompt_logprobs)
            t.prompt_logprobs = prompt_lps[seq.request_id]
        if seq.logprobs is not None:
            t.logprobs = [_logprobs(all_logits[i], token, seq.params.logprobs)]  # raw: before processing and temperature
        return t

    def _verify(self, seq: Sequence, rows: torch.Tensor) -> SampledTokens:
        """Speculative decoding: the verifier's tokens for seq from rows [k + 1, vocab], one per verified
        position (SpecDecoder.verify), with their raw logprobs if asked for."""
        k = len(rows) - 1
        tokens = self.spec.verify(seq, rows)
        lps = None if seq.logprobs is None else [_logprobs(rows[i], t, seq.params.logprobs) for i, t in enumerate(tokens)]
        return SampledTokens(seq, tokens, num_drafts=k, logprobs=lps)

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """Parallel sampling: the n - 1 children of a request whose prompt is computed, each with its own
        generator; Scheduler.update_from_output puts them in the batch, sharing the parent's blocks."""
        children = []
        for i in range(1, parent.pending_forks + 1):
            child = Sequence(next(self._seq_ids), parent.request_id, parent.token_ids, parent.params,
                             replace(parent.metrics, token_times=[]), make_generator(parent.params.seed, i, self.device),
                             index=i, stop_ids=parent.stop_ids)
            child.pending_forks = 0
            children.append(child)
        self.requests[parent.request_id] += children
        return children

    def _with_request_outputs(self, outputs: list[StepOutput]) -> list[StepOutput]:
        """Each request whose sequences have all finished leaves self.requests; its RequestOutput goes with the
        last of its StepOutputs here."""
        last = {o.request_id: o for o in outputs if o.finished}
        for rid, out in last.items():
            seqs = self.requests.get(rid)
            if seqs is not None and all(s.status is Status.FINISHED for s in seqs):
                out.output = request_output(self.requests.pop(rid), self.tokenizer)
        return outputs

    def _record_stats(self, so, t0: float, in_prefill: list[bool], forward_time: float | None = None) -> None:
        """in_prefill: per scheduled chunk (so.scheduled order), whether its sequence was prefilling when the
        step began. Counted by that, not by kernel: a prompt's one-token last chunk runs as a decode."""
        free = self.block_manager.num_free()
        prefill = [s for s, p in zip(so.scheduled, in_prefill) if p]
        decode = [s for s, p in zip(so.scheduled, in_prefill) if not p]
        self.step_stats.append(StepStats(
            step=len(self.step_stats), start_time=t0, wall_time=self.clock() - t0,
            num_prefill_tokens=sum(s.num_tokens for s in prefill), num_decode_tokens=sum(s.num_tokens for s in decode),
            num_prefill_seqs=len(prefill), num_decode_seqs=len(decode),
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            num_preempted=len(so.preempted), blocks_used=self.num_blocks - free, blocks_free=free,
            num_cached_tokens=so.num_cached_tokens, forward_time=forward_time,
            **(self.spec.take_step_counts() if self.spec is not None else {})))

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Prefix-cache totals (queries, hits, evictions) since the engine started; None with caching off."""
        return getattr(self.block_manager, "stats", None)

    @torch.inference_mode()
    def score(self, prompt) -> torch.Tensor:
        """Logits [len(prompt), vocab] at every position in one prefill forward (perplexity, KL checks,
        or verifying drafted tokens). Uses free cache blocks for the duration of the call only."""
        ids = self.tokenize(prompt)
        seq = Sequence(-1, "score", ids, SamplingParams(max_tokens=1), RequestMetrics(self.clock()))
        seq.num_logits = len(ids)
        if not self.block_manager.can_reserve(seq, len(ids)):
            raise RuntimeError(f"score() needs {self.block_manager.blocks_needed(seq, len(ids))} free KV blocks, "
                               f"{self.block_manager.num_free()} are free: call it when fewer requests run")
        self.block_manager.reserve(seq, len(ids))
        try:
            so = SchedulerOutput(prefills=[ScheduledSeq.chunk(seq, len(ids))])
            return self.runner.execute(so)
        finally:
            self.block_manager.free(seq)

    # ---- streaming ------------------------------------------------------------------------------
    def stream(self, prompts, params: SamplingParams | None = None) -> Iterator[StepOutput]:
        """Add the prompt(s) and step until they finish or are aborted (the last StepOutput of an aborted one has
        finish_reason "abort"), yielding every StepOutput as it is produced (other requests in the engine
        progress too; filter on request_id)."""
        ids = {self.add_request(p, params) for p in _as_prompt_list(prompts)}
        while ids:
            for out in self.step():
                if out.output is not None:
                    ids.discard(out.request_id)
                yield out


def _logprobs(logits: torch.Tensor, token: int, k: int) -> dict[int, float]:
    """Log-softmax of the raw logits (before penalties, logit_bias and temperature: vLLM's default
    "raw_logprobs"): the top k in rank order, then the sampled token if it is not among them."""
    lp = torch.log_softmax(logits.float(), -1)
    top = lp.topk(min(k, lp.numel())) if k else None
    d = {} if top is None else dict(zip(top.indices.tolist(), top.values.tolist()))
    d[token] = lp[token].item()
    return d


def _prompt_logprobs(rows: torch.Tensor, prompt: list[int], k: int) -> list[dict[int, float] | None]:
    """Per prompt token: None for the first (nothing precedes it), then the logprob of token j under row j - 1
    and the top k of that row, as a _logprobs dict. rows: [len(prompt), vocab] raw logits."""
    out: list[dict[int, float] | None] = [None]
    if len(prompt) < 2:
        return out
    lp = torch.log_softmax(rows[:len(prompt) - 1].float(), -1)
    actual = lp.gather(-1, torch.tensor(prompt[1:], device=lp.device)[:, None])[:, 0].tolist()
    top = lp.topk(min(k, lp.shape[-1]), dim=-1) if k else None
    for j in range(len(prompt) - 1):
        d = {} if top is None else dict(zip(top.indices[j].tolist(), top.values[j].tolist()))
        d[prompt[j + 1]] = actual[j]
        out.append(d)
    return out


def _as_prompt_list(prompts) -> list:
    """A string or a token-id list is one prompt; a list of those is many."""
    if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a string, a token-id list or a list of those, got {type(prompts).__name__}")
    return list(prompts)


def _load(model, config: EngineConfig):
    """(config.json, the model or None, the tokenizer): at tensor_parallel_size 1 the weights, here and quantized
    as asked; with more only what scheduling and detokenizing need (the workers load their shards)."""
    m = config.model
    if config.parallel.tensor_parallel_size > 1:
        model_config, tokenizer = load_config(model)
        return model_config, None, tokenizer
    model_config, net, tokenizer = load_model(model, m.device, m.dtype)
    if m.quantization is not None:
        quantize_model(net, m.quantization)
    return model_config, net, tokenizer
