"""EngineConfig: every LLMEngine argument in vLLM's parts (vllm/config: VllmConfig's ModelConfig, CacheConfig,
SchedulerConfig, ParallelConfig, SpeculativeConfig), checked once, here, and the engine's Clock protocols.

    EngineConfig.from_kwargs(block_size=16, max_num_seqs=64, ...)      what LLMEngine(model, **kwargs) builds
    LLMEngine(model, config=EngineConfig(cache=CacheConfig(block_size=8), scheduler=SchedulerConfig(...)))

Each part checks its own arguments when it is built (__post_init__), EngineConfig the ones that involve
two parts. A few values depend on the model (config.json) and, on CUDA, on the memory the weights left
free: resolve(model_config) fills them in once the model is loaded (max_model_len capped at the model's,
num_blocks, max_seq_len, the default max_num_batched_tokens) and checks what depends on them. The parts
hand each piece of the engine what it needs: the Scheduler the scheduler part, SpecDecoder the speculative
one and the sizes it shares, the runners the model and cache parts.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from .config import kv_bytes_per_token
from .device import default_device, default_dtype
from .distributed import ShardSpec
from .quantization import METHODS, resolve_kv_cache_dtype

if TYPE_CHECKING:
    from .config import ModelConfig
    from .scheduler import SchedulerOutput
    from .sim.gpu_model import StepTime

CPU_KV_CACHE_BYTES = 512 << 20  # default KV budget on CPU; capped by what max_num_seqs full sequences need
GPU_MEMORY_UTILIZATION = 0.8  # default KV budget on CUDA: this share of the memory free after the weights
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


# -- clocks ------------------------------------------------------------------------------------------------

@runtime_checkable
class Clock(Protocol):
    """LLMEngine(clock=...): seconds, for every timestamp (RequestMetrics, StepStats). time.perf_counter
    by default; any callable returning a float will do."""

    def __call__(self) -> float: ...


@runtime_checkable
class StepClock(Clock, Protocol):
    """A clock the engine tells about each step that runs a forward (sim.gpu_model.ModeledClock,
    tools.profiling.CountingClock), before the step moves num_computed_tokens on."""

    def advance(self, schedule: SchedulerOutput) -> StepTime | None:
        """The step's modeled time (its time_s and overhead_s: StepStats.forward_time is their difference),
        or None for a clock that only records the schedule (then forward_time is the measured forward)."""


@runtime_checkable
class DraftClock(Protocol):
    """A clock that also prices each forward of a speculative draft model (sim.gpu_model.ModeledClock)."""

    def advance_draft(self, schedule: SchedulerOutput) -> StepTime | None: ...


@runtime_checkable
class IdleClock(Protocol):
    """A clock a replay moves over idle time instead of sleeping (sim.gpu_model.ModeledClock, a skip-idle clock)."""

    def advance_to(self, t: float) -> None: ...


# -- the parts ---------------------------------------------------------------------------------------------

def _positive_int(name: str, v) -> None:
    if not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")


def _set(obj, **values) -> None:
    """Normalise fields of a frozen part in its __post_init__ (a dtype name -> torch.dtype, ...)."""
    for name, v in values.items():
        object.__setattr__(obj, name, v)


@dataclass(frozen=True)
class EngineModelConfig:
    """The model as the engine runs it (vLLM's ModelConfig; config.ModelConfig is config.json itself).
    device: None = cuda if available, else cpu; dtype: None / "auto" = the device's default, a name in
    _DTYPES or a torch.dtype; quantization: None or one of quantization.METHODS (weights); max_model_len:
    None = the model's (max_position_embeddings, or sliding_window), a smaller value caps it; attention_backend:
    None (the device's best), a name in attention.BACKENDS, or an interfaces.AttentionBackend. enforce_eager:
    never capture CUDA graphs (vLLM's name); max_cudagraph_capture_size: the largest decode batch captured
    (None: max_num_seqs, at most cuda_graphs.MAX_CAPTURE_SIZE); see cuda_graphs.py."""
    device: Any = None
    dtype: Any = None
    quantization: str | None = None
    max_model_len: int | None = None
    attention_backend: Any = None
    enforce_eager: bool = False
    max_cudagraph_capture_size: int | None = None

    def __post_init__(self):
        device = torch.device(self.device) if self.device is not None else default_device()
        _set(self, device=device, dtype=resolve_dtype(self.dtype, device))
        if self.max_cudagraph_capture_size is not None:
            _positive_int("max_cudagraph_capture_size", self.max_cudagraph_capture_size)
        if self.quantization is not None and self.quantization not in METHODS:
            raise ValueError(f"unknown quantization {self.quantization!r}; choose one of {METHODS} (or None for none)")


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache. num_blocks: blocks of block_size tokens (None: as many as kv_cache_memory_bytes
    holds, or 512 MiB on CPU / 80% of the GPU memory free after the weights, capped at max_num_seqs
    full-length sequences); kv_cache_dtype "auto" (the model dtype) or "fp8" (a block takes half the bytes);
    enable_prefix_caching and prefix_cache (a class or callable block_size -> interfaces.PrefixCache);
    block_allocator: a class or callable num_blocks -> interfaces.BlockAllocator."""
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = False
    prefix_cache: Any = None
    block_allocator: Any = None

    def __post_init__(self):
        _positive_int("block_size", self.block_size)
        if self.num_blocks is not None:
            _positive_int("num_blocks", self.num_blocks)
        resolve_kv_cache_dtype(self.kv_cache_dtype, torch.float32)  # the name only: "auto" or "fp8"


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching: at most max_num_seqs running sequences and max_num_batched_tokens tokens a step
    (None: 512 with chunked prefill, else the longest sequence), prompts in chunks or whole
    (enable_chunked_prefill), admitted by policy (interfaces.SchedulerPolicy, an instance or a class; None:
    scheduler.FCFSPolicy). max_seq_len, the longest sequence served (the model's limit, or what the KV cache
    holds if less), is set by EngineConfig.resolve."""
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    policy: Any = None
    max_seq_len: int | None = None

    def __post_init__(self):
        _positive_int("max_num_seqs", self.max_num_seqs)
        n = self.max_num_batched_tokens
        if n is not None and n < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({n}) must be >= max_num_seqs ({self.max_num_seqs}): "
                             "every running sequence needs a token each step")
        if n is not None and self.max_seq_len is not None and not self.enable_chunked_prefill and n < self.max_seq_len:
            raise ValueError(f"with enable_chunked_prefill=False, max_num_batched_tokens ({n}) must be >= "
                             f"the longest sequence ({self.max_seq_len}) so a preempted one can be prefilled in one step")


@dataclass(frozen=True)
class ParallelConfig:
    """tensor_parallel_size: shard the model over that many worker processes (tp_runner.py)."""
    tensor_parallel_size: int = 1

    def __post_init__(self):
        _positive_int("tensor_parallel_size", self.tensor_parallel_size)


_SPEC_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "verifier"}


@dataclass(frozen=True)
class SpeculativeConfig:
    """speculative_config as vLLM names it: method "draft_model" (the default when "model" is given; a
    "model" of "ngram" selects the ngram method, as vLLM accepts) or "ngram"; num_speculative_tokens k >= 1;
    for ngram prompt_lookup_max / prompt_lookup_min (one given: the other equals it; neither: 5 and 5, vLLM's
    defaults). verifier: an object with verify and verify_greedy (interfaces.SpeculativeVerifier); None =
    spec_decode.RejectionVerifier."""
    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    verifier: Any = None

    @classmethod
    def from_dict(cls, d: dict) -> SpeculativeConfig:
        if not isinstance(d, dict):
            raise TypeError(f"speculative_config must be a dict, got {type(d).__name__}")
        unknown = set(d) - _SPEC_KEYS
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {sorted(unknown)}; known: {sorted(_SPEC_KEYS)}")
        model, method = d.get("model"), d.get("method")
        if method is None:
            method = "ngram" if model == "ngram" else "draft_model"
        if method not in ("draft_model", "ngram"):
            raise ValueError(f"speculative_config method {method!r}: supported are 'draft_model' and 'ngram'")
        if method == "draft_model" and not model:
            raise ValueError("speculative_config needs 'model' (the draft model's directory) for method 'draft_model'")
        k = d.get("num_speculative_tokens")
        if not _is_int(k) or k < 1:
            raise ValueError(f"speculative_config num_speculative_tokens must be an integer >= 1, got {k!r}")
        n_max, n_min = d.get("prompt_lookup_max"), d.get("prompt_lookup_min")
        if method == "ngram":
            n_max, n_min = (n_max or n_min or 5), (n_min or n_max or 5)
            if not (_is_int(n_max) and _is_int(n_min) and 1 <= n_min <= n_max):
                raise ValueError(f"speculative_config prompt_lookup_min={n_min!r}, prompt_lookup_max={n_max!r}: "
                                 "need integers with 1 <= min <= max")
        verifier = d.get("verifier")
        if verifier is not None and not all(callable(getattr(verifier, m, None)) for m in ("verify", "verify_greedy")):
            raise TypeError(f"speculative_config verifier {verifier!r} needs methods verify(target_probs, draft_probs, "
                            "draft_tokens, generator) and verify_greedy(target_logits, draft_tokens) "
                            "(interfaces.SpeculativeVerifier)")
        return cls(method, k, None if method == "ngram" else str(model), n_max, n_min, verifier)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# -- the whole -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineConfig:
    """LLMEngine's configuration: the parts above, the speculative part (None: off) and the clock."""
    model: EngineModelConfig = field(default_factory=EngineModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative: SpeculativeConfig | None = None
    clock: Clock = time.perf_counter

    def __post_init__(self):
        if self.parallel.tensor_parallel_size > 1 and not isinstance(self.model.attention_backend, (str, type(None))):
            raise ValueError("with tensor_parallel_size > 1 attention_backend must be a backend name: each worker "
                             "process builds its own")
        if not callable(self.clock):
            raise TypeError(f"clock must be a callable returning seconds (engine_config.Clock), got {self.clock!r}")

    @classmethod
    def from_kwargs(cls, *, block_size: int = 16, num_blocks: int | None = None, max_num_seqs: int = 64,
                    max_num_batched_tokens: int | None = None, enable_chunked_prefill: bool = True, device=None,
                    dtype=None, attention_backend=None, block_allocator=None, scheduler_policy=None,
                    max_model_len: int | None = None, kv_cache_memory_bytes: int | None = None,
                    clock=time.perf_counter, speculative_config: dict | None = None,
                    enable_prefix_caching: bool = False, prefix_cache=None, quantization: str | None = None,
                    kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1, enforce_eager: bool = False,
                    max_cudagraph_capture_size: int | None = None) -> EngineConfig:
        """LLMEngine's keywords (vLLM's names; LLMEngine's docstring says what each does) -> the parts."""
        return cls(
            # checked in this order: the counts first, then the device's dtype, then the rest
            parallel=ParallelConfig(tensor_parallel_size),
            cache=CacheConfig(block_size, num_blocks, kv_cache_memory_bytes, kv_cache_dtype, enable_prefix_caching,
                              prefix_cache, block_allocator),
            scheduler=SchedulerConfig(max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, scheduler_policy),
            model=EngineModelConfig(device, dtype, quantization, max_model_len, attention_backend, enforce_eager,
                                    max_cudagraph_capture_size),
            speculative=None if speculative_config is None else SpeculativeConfig.from_dict(speculative_config),
            clock=clock)

    # ---- what needs the model ----------------------------------------------------------------------------
    @property
    def kv_cache_dtype(self) -> torch.dtype:
        """The KV cache's torch dtype: the model's for "auto", float8_e4m3fn for "fp8"."""
        return resolve_kv_cache_dtype(self.cache.kv_cache_dtype, self.model.dtype)

    @property
    def resolved(self) -> bool:
        """Whether resolve() has filled in what depends on the model (an engine runs on a resolved config)."""
        return self.scheduler.max_seq_len is not None

    def kv_bytes_per_token_per_rank(self, model_config: ModelConfig) -> int:
        """KV-cache bytes one token takes on one rank: its KV heads only (all of them at tensor_parallel_size 1)."""
        c, tp = model_config, self.parallel.tensor_parallel_size
        kv_heads = len(ShardSpec(0, tp).kv_heads(c.num_key_value_heads))
        return kv_bytes_per_token(c, self.kv_cache_dtype.itemsize) * kv_heads // c.num_key_value_heads

    def resolve(self, model_config: ModelConfig) -> EngineConfig:
        """The config with what depends on the model filled in and checked: max_model_len capped at the model's,
        num_blocks (on CUDA call it after the weights are loaded: the default budget is the memory left),
        max_seq_len, max_num_batched_tokens. Raises ValueError if the model does not split across
        tensor_parallel_size or the KV budget holds no block."""
        c, m, s = model_config, self.model, self.scheduler
        if self.parallel.tensor_parallel_size > 1:
            ShardSpec(0, self.parallel.tensor_parallel_size).check(c.num_attention_heads, c.num_key_value_heads,
                                                                   c.intermediate_size)
        max_model_len = min(m.max_model_len or c.max_model_len, c.max_model_len)
        num_blocks = self.cache.num_blocks or self._default_num_blocks(c, max_model_len)
        # Longest sequence served: a sequence alone in the cache must always fit, so preemption never deadlocks.
        max_seq_len = min(max_model_len, num_blocks * self.cache.block_size)
        tokens = s.max_num_batched_tokens
        if tokens is None:
            tokens = 512 if s.enable_chunked_prefill else max(512, max_seq_len)
        return replace(self, model=replace(m, max_model_len=max_model_len),
                       cache=replace(self.cache, num_blocks=num_blocks),
                       scheduler=replace(s, max_num_batched_tokens=tokens, max_seq_len=max_seq_len))

    def _default_num_blocks(self, c: ModelConfig, max_model_len: int) -> int:
        per_block = self.kv_bytes_per_token_per_rank(c) * self.cache.block_size
        budget = self.cache.kv_cache_memory_bytes
        if budget is None:
            budget = self._free_memory(c)
        need = self.scheduler.max_num_seqs * -(-max_model_len // self.cache.block_size)
        n = min(need, budget // per_block)
        if n < 1:
            raise ValueError(f"kv_cache_memory_bytes={budget} holds no block of {per_block} bytes")
        return n

    def _free_memory(self, c: ModelConfig) -> int:
        """The default KV budget: CPU_KV_CACHE_BYTES on CPU; on CUDA most of the free memory, after the weights
        (loaded here at tensor_parallel_size 1; with more, the workers' shards still to come are set aside)."""
        device, tp = self.model.device, self.parallel.tensor_parallel_size
        if device.type != "cuda":
            return CPU_KV_CACHE_BYTES
        free = torch.cuda.mem_get_info(device)[0]
        if tp > 1:
            from .loader import _approx_params

            free -= _approx_params(c) * self.model.dtype.itemsize / tp
        return int(free * GPU_MEMORY_UTILIZATION)


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """None / "auto" -> the device's default dtype; a name in _DTYPES or a torch.dtype -> that dtype."""
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or a torch.dtype")
