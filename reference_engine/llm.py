"""LLM: the offline API in vLLM's shape, a thin loop over LLMEngine."""
from __future__ import annotations

from .engine import LLMEngine, _as_prompt_list
from .sampling import SamplingParams
from .sequence import RequestOutput


class LLM:
    """LLM(model=path, block_size=16, num_blocks=None, max_num_seqs=64, max_num_batched_tokens=None,
    enable_chunked_prefill=True, device=None, dtype=None, attention_backend=None, block_allocator=None,
    scheduler_policy=None, max_model_len=None, kv_cache_memory_bytes=None, clock=time.perf_counter,
    enable_prefix_caching=False, prefix_cache=None, speculative_config=None, quantization=None,
    kv_cache_dtype="auto", tensor_parallel_size=1), or LLM(model, config=EngineConfig(...)); every keyword goes
    to LLMEngine (engine_config.EngineConfig.from_kwargs checks them)."""

    def __init__(self, model, **engine_kwargs):
        self.engine = LLMEngine(model, **engine_kwargs)

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "LLM":
        llm = cls.__new__(cls)
        llm.engine = engine
        return llm

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts (a string, a token-id list, or a list of either) to completion; outputs in prompt order.

        All prompts are validated before any is queued, so a bad one leaves the engine untouched.
        """
        prompts = _as_prompt_list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        token_ids = [self.engine.validate(p, sp) for p, sp in zip(prompts, params)]
        ids = [self.engine.add_request(t, sp) for t, sp in zip(token_ids, params)]
        results, pending = {}, set(ids)
        bar = _progress(len(ids)) if use_tqdm else None
        while pending:
            for out in self.engine.step():
                if out.output is not None and out.request_id in pending:
                    results[out.request_id] = out.output
                    pending.discard(out.request_id)
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [results[i] for i in ids]


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req")
