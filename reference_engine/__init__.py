"""A small inference engine with the ideas vLLM and SGLang are built on: paged KV cache, continuous
batching, chunked prefill, preemption by recompute, parallel sampling with copy-on-write.

    from reference_engine import LLM, SamplingParams
    llm = LLM(model="path/to/hf_model_dir")
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
"""
from .device import ensure_triton_mode

ensure_triton_mode(strict=False)  # before anything imports triton; a no-op with CUDA

from .config import ModelConfig, kv_bytes_per_token
from .engine import LLMEngine
from .llm import LLM
from .sampling import SamplingParams
from .sequence import CompletionOutput, RequestMetrics, RequestOutput, StepOutput, StepStats

__all__ = ["LLM", "LLMEngine", "SamplingParams", "ModelConfig", "kv_bytes_per_token", "RequestOutput",
           "CompletionOutput", "RequestMetrics", "StepOutput", "StepStats"]
