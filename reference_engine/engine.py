"""LLMEngine: the step API. add_request() queues, step() runs one scheduler iteration + one forward."""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import replace

import torch

from .attention import get_backend
from .block_manager import BlockAllocator
from .config import kv_bytes_per_token
from .device import default_device, default_dtype
from .distributed import ShardSpec
from .loader import load_config, load_model
from .model_runner import ModelRunner
from .prefix_cache import PrefixCacheStats, make_block_manager
from .quantization import METHODS, Fp8KVBackend, quantize_model, resolve_kv_cache_dtype
from .sampling import SamplingParams, StopStrings, make_generator, process_logits, sample_isolated
from .scheduler import FCFSPolicy, ScheduledSeq, Scheduler, SchedulerOutput
from .sequence import CompletionOutput, RequestMetrics, RequestOutput, Sequence, Status, StepOutput, StepStats
from .spec_decode import SpecDecoder, SpeculativeConfig

CPU_KV_CACHE_BYTES = 512 << 20  # default KV budget on CPU; capped by what max_num_seqs full sequences need
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


class LLMEngine:
    """One process, one model, one paged KV cache. Arguments as vLLM names them, plus:
    num_blocks (KV blocks of block_size tokens; default: kv_cache_memory_bytes, or 512 MiB on CPU /
    80% of free GPU memory, capped at max_num_seqs full-length sequences), block_allocator /
    scheduler_policy / attention_backend (the hooks in interfaces.py), clock (timestamps).
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

    Trace replay: add_request(prompt, params, arrival_time=t) as requests arrive, step() in a loop
    while has_unfinished(); each finished request's RequestOutput comes in a StepOutput.output.
    """

    def __init__(self, model, *, block_size: int = 16, num_blocks: int | None = None, max_num_seqs: int = 64,
                 max_num_batched_tokens: int | None = None, enable_chunked_prefill: bool = True, device=None,
                 dtype=None, attention_backend=None, block_allocator=None, scheduler_policy=None,
                 max_model_len: int | None = None, kv_cache_memory_bytes: int | None = None, clock=time.perf_counter,
                 speculative_config: dict | None = None, enable_prefix_caching: bool = False, prefix_cache=None,
                 quantization: str | None = None, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1):
        for name, v in (("block_size", block_size), ("max_num_seqs", max_num_seqs), ("tensor_parallel_size", tensor_parallel_size)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = _resolve_dtype(dtype, self.device)
        t_load = time.perf_counter()
        self.tensor_parallel_size = tensor_parallel_size
        self.quantization, self.kv_cache_dtype = quantization, resolve_kv_cache_dtype(kv_cache_dtype, self.dtype)
        if tensor_parallel_size == 1:
            self.config, self.model, self.tokenizer = load_model(model, self.device, self.dtype)
            if quantization is not None:
                quantize_model(self.model, quantization)
        else:  # the workers load their shards; here only what scheduling and detokenizing need
            self.config, self.tokenizer = load_config(model)
            self.model = None
            c = self.config
            ShardSpec(0, tensor_parallel_size).check(c.num_attention_heads, c.num_key_value_heads, c.intermediate_size)
            if quantization is not None and quantization not in METHODS:
                raise ValueError(f"unknown quantization {quantization!r}; choose one of {METHODS}")
            if attention_backend is not None and not isinstance(attention_backend, str):
                raise ValueError("with tensor_parallel_size > 1 attention_backend must be a backend name: each worker "
                                 "process builds its own")
        # Seconds spent loading (config, weights, tokenizer) and allocating the KV cache; startup.py reports them.
        self.init_times = {"load_model": time.perf_counter() - t_load}
        self.clock, self.block_size = clock, block_size
        self.max_model_len = min(max_model_len or self.config.max_model_len, self.config.max_model_len)
        self.num_blocks = num_blocks if num_blocks is not None else self._default_num_blocks(max_num_seqs, kv_cache_memory_bytes)
        if not isinstance(self.num_blocks, int) or self.num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {self.num_blocks!r}")
        # Longest sequence served: a sequence alone in the cache must always fit, so preemption never deadlocks.
        self.max_seq_len = min(self.max_model_len, self.num_blocks * block_size)
        if max_num_batched_tokens is None:
            max_num_batched_tokens = 512 if enable_chunked_prefill else max(512, self.max_seq_len)
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs}): "
                             "every running sequence needs a token each step")
        if not enable_chunked_prefill and max_num_batched_tokens < self.max_seq_len:
            raise ValueError(f"with enable_chunked_prefill=False, max_num_batched_tokens ({max_num_batched_tokens}) must be >= "
                             f"the longest sequence ({self.max_seq_len}) so a preempted one can be prefilled in one step")
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        allocator = (block_allocator or BlockAllocator)(self.num_blocks)
        self.block_manager = make_block_manager(allocator, block_size, self.num_blocks, enable_prefix_caching, prefix_cache)
        policy = scheduler_policy() if isinstance(scheduler_policy, type) else (scheduler_policy or FCFSPolicy())
        self.scheduler = Scheduler(self.block_manager, policy, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill)
        self.backend = get_backend(attention_backend, self.device, block_size)
        if self.kv_cache_dtype.itemsize == 1:  # fp8 cache: quantize on write, dequantize on read
            self.backend = Fp8KVBackend(self.backend)
        t_kv = time.perf_counter()
        if tensor_parallel_size == 1:
            self.runner = ModelRunner(self.model, block_size, self.num_blocks, self.device, self.dtype, self.backend,
                                      cache_dtype=self.kv_cache_dtype)
        else:  # the workers' start-up (imports, weights, KV cache, all ranks at once) is timed as tp_workers
            from .tp_runner import TPModelRunner

            self.runner = TPModelRunner(tensor_parallel_size, model=model, device=self.device, dtype=self.dtype,
                                        block_size=block_size, num_blocks=self.num_blocks, backend=attention_backend,
                                        quantization=quantization, cache_dtype=self.kv_cache_dtype)
            self.init_times["tp_workers"], t_kv = time.perf_counter() - t_kv, time.perf_counter()
        self.runner.clock = self.clock  # StepStats.forward_time on the same clock as wall_time
        self.init_times["kv_allocation"] = time.perf_counter() - t_kv
        self.spec = None if speculative_config is None else SpecDecoder(SpeculativeConfig.from_dict(speculative_config), self)
        self.requests: dict[str, list[Sequence]] = {}
        self.step_stats: list[StepStats] = []
        self._ids, self._seq_ids = itertools.count(), itertools.count()
        self._eos = frozenset(self.config.eos_token_ids)
        self._aborted: list[StepOutput] = []  # aborts since the last step(), which reports them
        # request id -> the exception that ended it, for each request the last step() finished with "error"
        self.step_errors: dict[str, BaseException] = {}

    def kv_bytes_per_token_per_rank(self) -> int:
        """KV-cache bytes one token takes on one rank: its KV heads only (all of them at tensor_parallel_size 1)."""
        c = self.config
        kv_heads = len(ShardSpec(0, self.tensor_parallel_size).kv_heads(c.num_key_value_heads))
        return kv_bytes_per_token(c, self.kv_cache_dtype.itemsize) * kv_heads // c.num_key_value_heads

    def kv_cache_bytes_per_rank(self) -> list[int]:
        """Bytes each rank's K and V caches actually allocated (one entry at tensor_parallel_size 1)."""
        if hasattr(self.runner, "kv_cache_bytes"):
            return list(self.runner.kv_cache_bytes)
        return [self.runner.k_cache.nbytes + self.runner.v_cache.nbytes]

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do at tensor_parallel_size 1); the engine is unusable after."""
        if hasattr(self.runner, "shutdown"):
            self.runner.shutdown()

    def _default_num_blocks(self, max_num_seqs: int, budget: int | None) -> int:
        per_block = self.kv_bytes_per_token_per_rank() * self.block_size
        if budget is None:
            if self.device.type == "cuda" and self.model is None:  # tensor-parallel: weights go to the workers' GPUs
                from .loader import _approx_params

                weights = _approx_params(self.config) * self.dtype.itemsize / self.tensor_parallel_size
                budget = int((torch.cuda.mem_get_info(self.device)[0] - weights) * 0.8)
            elif self.device.type == "cuda":  # after the weights are loaded: most of what is free
                budget = int(torch.cuda.mem_get_info(self.device)[0] * 0.8)
            else:
                budget = CPU_KV_CACHE_BYTES
        need = max_num_seqs * -(-self.max_model_len // self.block_size)
        n = min(need, budget // per_block)
        if n < 1:
            raise ValueError(f"kv_cache_memory_bytes={budget} holds no block of {per_block} bytes")
        return n

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
        params = params if params is not None else SamplingParams()
        if hold_kv and params.n != 1:
            raise ValueError("hold_kv needs SamplingParams.n == 1: forked samples share blocks")
        ids = self.validate(prompt, params)
        prefix = list(output_prefix or [])
        if prefix:
            if params.n != 1 or hold_kv or params.prompt_logprobs is not None:
                raise ValueError("output_prefix needs SamplingParams.n == 1, no prompt_logprobs and no hold_kv")
            self.tokenize(ids + prefix)  # the same checks as a prompt: ids in the vocabulary, room to generate
            if len(prefix) >= params.max_tokens:
                raise ValueError(f"output_prefix has {len(prefix)} tokens: max_tokens={params.max_tokens} leaves "
                                 "nothing to generate")
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self.requests:  # skip ids a caller chose by hand
                request_id = str(next(self._ids))
        request_id = str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        metrics = RequestMetrics(arrival_time=self.clock() if arrival_time is None else arrival_time)
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos)
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
        self.requests[request_id] = [seq]
        self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request wherever it is (waiting or running); its blocks return to the pool. Returns its
        RequestOutput (finish_reason "abort"), which the next step() also reports, in a StepOutput per aborted
        sequence (as vLLM finishes an aborted stream). Unknown or finished ids are ignored (None)."""
        if request_id not in self.requests:
            return None
        ended, output = self._end_request(request_id, "abort")
        self._aborted += ended  # the next step() reports them, so a stream() or step loop over them ends
        return output

    def _end_request(self, request_id: str, reason: str) -> tuple[list[StepOutput], RequestOutput]:
        """Finish every unfinished sequence of a request now with `reason` ("abort", "error"), freeing its
        blocks. Returns one StepOutput per sequence ended (the last carries the RequestOutput) and the
        RequestOutput."""
        seqs = self.requests.pop(request_id)
        now, ended = self.clock(), []
        for seq in seqs:
            if seq.status is not Status.FINISHED:
                self.scheduler.finish(seq)
                seq.finish_reason, seq.metrics.finish_time = reason, now
                ended.append(StepOutput(request_id, seq.index, [], True, reason))
        if self.spec is not None:
            self.spec.collect()  # unverified drafts leave the output; the draft model's cache is freed
        output = self._request_output(seqs)
        if ended:
            ended[-1].output = output
        return ended, output

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
        prompt's KV will be written into (seq.block_table), outside the scheduler until admit_received.
        None when the blocks do not fit now (decode steps free some; try again)."""
        params = params if params is not None else SamplingParams()
        if params.n != 1 or self.spec is not None:
            raise ValueError("a received request needs SamplingParams.n == 1 and no speculative decoding here")
        request_id = self.add_request(prompt, params, str(request_id), arrival_time)  # built as any request is,
        seq = self.requests.pop(request_id)[0]  # then taken back out: it never waits to be prefilled here
        self.scheduler.waiting.remove(seq)
        if not self.block_manager.can_reserve(seq, seq.num_prompt_tokens):
            return None
        self.block_manager.reserve(seq, seq.num_prompt_tokens)
        return seq

    def admit_received(self, seq: Sequence, first_token: int) -> StepOutput:
        """Decode side: the prompt's KV is in seq's blocks. Count the prompt as computed, append the first
        token (sampled by the prefill instance) and join the running batch; the next step decodes it.
        Returns the first token's StepOutput (finished already if that token ends the request)."""
        seq.num_computed_tokens = seq.num_prompt_tokens
        seq.status = Status.RUNNING
        seq.metrics.first_scheduled_time = self.clock()
        self.requests[seq.request_id] = [seq]
        self.scheduler.running.append(seq)
        return self._append_token(seq, int(first_token), self.clock())

    def free_received(self, seq: Sequence) -> None:
        """Decode side: drop a received sequence before admit_received (its transfer was aborted)."""
        self.block_manager.free(seq)

    # ---- the step -------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """Schedule, run one forward over every scheduled token, sample. Returns one StepOutput per new token,
        preceded by one (no new token, finish_reason "abort") per sequence aborted since the previous step.

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
        if self.spec is not None:
            self.spec.propose(self.scheduler.running, self.max_num_batched_tokens)
        so = self.scheduler.schedule()
        if self.spec is not None:
            for seq in so.preempted:
                self.spec.discard(seq)  # it recomputes; the drafts go
        if so.block_copies:
            self.runner.copy_blocks(so.block_copies)
        if so.scheduled:
            for s in so.prefills:
                if s.seq.metrics.first_scheduled_time is None:
                    s.seq.metrics.first_scheduled_time = t0
            modeled = None
            if hasattr(self.clock, "advance"):  # modeled GPU time (gpu_model.ModeledClock): the step's cost is
                modeled = self.clock.advance(so)  # read from the schedule here, before num_computed_tokens moves on
            in_prefill = [s.seq.in_prefill for s in so.scheduled]  # before num_computed_tokens moves on
            rows = self.runner.execute(so).split([s.num_logits for s in so.scheduled])
            for s in so.scheduled:
                s.seq.num_computed_tokens += s.num_tokens
            outputs += self._sample([(s.seq, r) for s, r in zip(so.scheduled, rows) if s.num_logits])
            forward = self.runner.last_forward_time  # on a modeled clock: the modeled kernels, not this CPU's forward
            if hasattr(modeled, "time_s") and hasattr(modeled, "overhead_s"):
                forward = modeled.time_s - modeled.overhead_s
            self._record_stats(so, t0, in_prefill, forward_time=forward)
        elif so.preempted:
            self._record_stats(so, t0, [])
        if self.spec is not None:
            self.spec.collect()
        return outputs

    def _sample(self, chunks: list[tuple[Sequence, torch.Tensor]]) -> list[StepOutput]:
        """chunks: (sequence, its chunk's logit rows) for every chunk that yielded rows. One token for each
        sequence whose chunk reached its last token, from the last row; the rows of a sequence asking for
        num_logits > 1 are kept across its chunks until then, and returned in its StepOutput."""
        seqs, last_rows, kept, verified = [], [], [], []
        for seq, rows in chunks:
            if seq.num_logits > 1:
                seq.kept_logits.append(rows)
                if seq.num_computed_tokens < seq.num_tokens:  # not the last chunk: the rest come later
                    continue
                rows, seq.kept_logits, seq.num_logits = torch.cat(seq.kept_logits), [], 1
            if self.spec is not None and self.spec.has_drafts(seq):
                verified.append((seq, rows))
                continue
            group = [seq] + self._fork(seq) if seq.pending_forks else [seq]
            seqs += group
            last_rows += [rows[-1]] * len(group)
            kept += [rows if len(rows) > 1 else None] * len(group)
        if not seqs and not verified:
            return []
        logits = torch.stack(last_rows) if seqs else None
        failed: dict[int, Exception] = {}
        if seqs:
            params = [s.params for s in seqs]
            try:
                processed = process_logits(logits, params, [s.token_ids for s in seqs],
                                           [s.num_prompt_tokens for s in seqs], [s.stop_ids for s in seqs])
            except Exception as e:  # a bug: the rows that needed processing fail alone
                failed = {i: e for i, p in enumerate(params) if p.processes_logits}
                processed = logits
            tokens, sample_failed = sample_isolated(processed, params, [s.generator for s in seqs])
            failed.update(sample_failed)
            tokens = tokens.tolist()
        else:
            tokens = []
        now = self.clock()
        outputs = [self._append_verified(seq, rows, now) for seq, rows in verified]
        for i, e in sorted(failed.items()):  # a row whose sampling raised ends its request (all n samples) alone
            rid = seqs[i].request_id
            if rid not in self.step_errors:
                self.step_errors[rid] = e
                outputs += self._end_request(rid, "error")[0]
        prompt_lps: dict[str, list] = {}  # request id -> its prompt logprobs (computed once for n samples)
        for i, (seq, tok) in enumerate(zip(seqs, tokens)):
            if seq.request_id in self.step_errors:
                continue
            if seq.params.prompt_logprobs is not None and seq.prompt_logprobs is None:
                if seq.request_id not in prompt_lps:
                    rows = kept[i] if kept[i] is not None else logits[i:i + 1]
                    prompt_lps[seq.request_id] = _prompt_logprobs(rows, seq.token_ids[:seq.num_prompt_tokens],
                                                                  seq.params.prompt_logprobs)
                seq.prompt_logprobs = prompt_lps[seq.request_id]
            lp = None
            if seq.logprobs is not None:
                lp = _logprobs(logits[i], tok, seq.params.logprobs)  # raw: before processing and temperature
                seq.logprobs.append(lp)
            out = self._append_token(seq, tok, now)
            out.logits, out.logprobs = kept[i], None if lp is None else [lp]
            if seq.prompt_logprobs is not None and seq.num_output_tokens == 1:
                out.prompt_logprobs = seq.prompt_logprobs
            outputs.append(out)
        return outputs

    def _append_verified(self, seq: Sequence, rows: torch.Tensor, now: float) -> StepOutput:
        """Speculative decoding: the verifier's tokens for seq (rows [k + 1, vocab], one per verified position),
        appended one by one until one ends the sequence; one StepOutput carries them all."""
        tokens = self.spec.verify(seq, rows)
        lps = []
        for i, tok in enumerate(tokens):
            if seq.logprobs is not None:
                lps.append(_logprobs(rows[i], tok, seq.params.logprobs))
                seq.logprobs.append(lps[-1])
            out = self._append_token(seq, tok, now)
            if out.finished:
                break
        out.new_token_ids = tokens[:i + 1]
        out.logprobs = lps if seq.logprobs is not None else None
        return out

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """Parallel sampling: n - 1 children share the parent's blocks (ref counts), copy-on-write later."""
        children = []
        for i in range(1, parent.pending_forks + 1):
            child = Sequence(next(self._seq_ids), parent.request_id, parent.token_ids, parent.params,
                             replace(parent.metrics, token_times=[]), make_generator(parent.params.seed, i, self.device),
                             index=i, stop_ids=parent.stop_ids)
            child.pending_forks = 0
            child.num_computed_tokens, child.status = parent.num_computed_tokens, Status.RUNNING
            self.block_manager.fork(parent, child)
            children.append(child)
        parent.pending_forks = 0
        at = self.scheduler.running.index(parent) + 1
        self.scheduler.running[at:at] = children
        self.requests[parent.request_id] += children
        return children

    def _append_token(self, seq: Sequence, token: int, now: float) -> StepOutput:
        seq.token_ids.append(token)
        m = seq.metrics
        m.token_times.append(now)
        if m.first_token_time is None:
            m.first_token_time = now
        reason = hit = None
        if token in seq.stop_ids:  # EOS (stop_reason None, as vLLM) or one of stop_token_ids
            reason = "stop"
            seq.stop_reason = token if token in seq.params.stop_token_ids and (
                seq.params.ignore_eos or token not in self._eos) else None
        elif seq.stop_strings is not None:
            hit = seq.stop_strings.check(self.tokenizer.decode(seq.output_token_ids), seq.num_output_tokens)
        if hit is not None:
            reason, seq.stop_reason = "stop", hit[0]
            seq.output_text = self.tokenizer.decode(seq.output_token_ids)[:hit[1]]
        elif reason is None and (seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= self.max_seq_len):
            reason = "length"
        out = StepOutput(seq.request_id, seq.index, [token], reason is not None, reason)
        if reason:
            seq.finish_reason, m.finish_time = reason, now
            out.stop_reason, out.text = seq.stop_reason, self._output_text(seq)
            self.scheduler.finish(seq, free=not seq.hold_kv)
            if all(s.status is Status.FINISHED for s in self.requests[seq.request_id]):
                out.output = self._request_output(self.requests.pop(seq.request_id))
        return out

    def _output_text(self, seq: Sequence) -> str | None:
        """The sequence's output text: cut at its stop string if one matched (None without a tokenizer)."""
        if seq.output_text is not None:
            return seq.output_text
        return self.tokenizer.decode(seq.output_token_ids) if self.tokenizer is not None else None

    def _request_output(self, seqs: list[Sequence]) -> RequestOutput:
        comps = [CompletionOutput(s.index, s.output_token_ids, self._output_text(s), s.finish_reason, s.metrics,
                                  s.logprobs, s.stop_reason)
                 for s in sorted(seqs, key=lambda s: s.index)]
        first = seqs[0]
        return RequestOutput(first.request_id, first.token_ids[:first.num_prompt_tokens], comps,
                             prompt_logprobs=first.prompt_logprobs)

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


def _resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or a torch.dtype")
