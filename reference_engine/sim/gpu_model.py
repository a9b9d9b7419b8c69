"""The modeled GPU clock: what one engine step would take on a real GPU.

The idea is Vidur's (Agrawal et al., MLSys 2024: simulate inference from per-operator cost models). The
engine runs on this CPU with its real scheduler; a ModeledClock turns each step's composition (the
prefill chunks and decode tokens it holds, with their contexts) into the seconds the same step would take
for a modeled model shape on a modeled chip, so TTFT, TPOT and ITL come out in modeled GPU seconds.

Step time = sum over kernels of a roofline time, plus a fixed per-step overhead:
- weight GEMMs (qkv_proj, o_proj, gate_up_proj, down_proj per layer; lm_head once): each is
  max(FLOPs / (peak * gemm_eff), bytes / (bandwidth * mem_eff)), bytes = weights + activations in and out;
- attention, per sequence: max(FLOPs / (peak * attn_eff), KV bytes / (bandwidth * mem_eff));
- under tensor parallelism, two all-reduces per layer (after o_proj and after down_proj).
Not modeled: norms, RoPE, SiLU and residual adds (elementwise, fused or small next to the GEMMs), sampling,
the embedding gather, and overlap between kernels (they run one after another).

Counting conventions are lesson 01's (solutions/l01_roofline.py), so the numbers agree with it:
a multiply-add is 2 FLOPs; C[m, n] = A[m, k] @ B[k, n] moves (m*k + k*n + m*n) elements; attention costs
4 * head_dim FLOPs per (query, key) pair and head, a chunk's i-th token seeing context + i + 1 keys; it
reads the cached K/V once and writes the new tokens' K/V once.
Units: seconds, FLOPs, bytes; TFLOP/s = 1e12 FLOP/s, GB/s = 1e9 bytes/s, MiB = 2**20 bytes.

    from reference_engine import LLM
    from reference_engine.sim.gpu_model import H100, LLAMA_3_8B, engine_kwargs
    llm = LLM("reference_engine/checkpoints/target", **engine_kwargs(LLAMA_3_8B, H100))
    # every timestamp and StepStats.wall_time of llm.engine is now in modeled H100 seconds

python -m reference_engine.sim.gpu_model --chip H100 --model llama-3-8b prints step time vs batch and chunk.
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from itertools import chain
from operator import itemgetter

MiB = 2**20

# ---------------------------------------------------------------- chips


@dataclass(frozen=True)
class Chip:
    """One GPU: datasheet peaks, the fractions of them real kernels reach, and its all-reduce cost.

    dense_tflops: dense bf16 tensor-core TFLOP/s; hbm_gb_per_s: HBM GB/s; memory_mib: memory as the driver
    (nvidia-smi / NVML) reports it, MiB. gemm_eff / attn_eff: achievable fraction of dense_tflops for weight
    GEMMs / attention; mem_eff: achievable fraction of hbm_gb_per_s. allreduce_latency_s and
    allreduce_gb_per_s: one all-reduce of P bytes across the TP group takes latency + P / (GB/s * 1e9).
    """
    name: str
    dense_tflops: float
    hbm_gb_per_s: float
    memory_mib: int
    gemm_eff: float
    attn_eff: float
    mem_eff: float
    allreduce_latency_s: float
    allreduce_gb_per_s: float

    @property
    def peak_flops(self) -> float:
        return self.dense_tflops * 1e12

    @property
    def bandwidth(self) -> float:
        """HBM bytes/s at the datasheet peak."""
        return self.hbm_gb_per_s * 1e9

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB

    @property
    def ridge(self) -> float:
        """FLOP/byte where a weight GEMM turns compute-bound, at the achievable fractions."""
        return self.peak_flops * self.gemm_eff / (self.bandwidth * self.mem_eff)

    def at_peak(self) -> Chip:
        """The same chip at 100% of every datasheet peak (lesson 01's roofline)."""
        return replace(self, gemm_eff=1.0, attn_eff=1.0, mem_eff=1.0)


# Peaks: vendor datasheets as quoted in /work/shared/reference-facts.md (dense bf16 TFLOP/s, HBM TB/s).
# Memory: "as the driver reports it" (reference-facts.md, added 2026-12-03, via Modal's blog "Why does an
# NVIDIA H100 80GB card offer 85.52 GB?"): the KV capacity below uses these MiB, not the datasheet "GB".
#
# gemm_eff, cited: Stas Bekman, "Machine Learning Engineering", compute/accelerator/README.md, "Maximum
# Achievable Matmul FLOPS comparison table" (mamf-finder.py, bf16, best shape found, mean of 100 iterations):
# A100 SXM 271.2 of 312 TFLOP/s = 86.9%; H100 SXM 794.5 of 989 = 80.3%, noted "H200 is the same".
# https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md
# A best-shape figure: thin decode GEMMs do worse; that shows up as memory time, which mem_eff covers.
#
# attn_eff, cited: FlashAttention-3 (Shah et al., 2024, abstract): on H100, FP16 "up to 740 TFLOPs/s (75%
# utilization)" -> 0.75 (H200 has the same compute; using the same fraction there is an ASSUMPTION).
# FlashAttention-2 (Dao, 2023, abstract): "50-73% of the theoretical maximum FLOPs/s on A100" -> 0.60
# (the range is cited; taking a value inside it is an ASSUMPTION).
#
# mem_eff, cited for A100: gpt-fast README (pytorch-labs/gpt-fast): on an A100 80GB power-limited to 330 W,
# "Empirically, seems like peak bandwidth is about 1700 GB/s": 1700 / 2039 = 0.834. Its own end-to-end
# Llama-2-7B batch-1 decode reached 1397 GB/s (0.685; see tests/test_gpu_model.py for that check).
# Using 0.834 for H100 and H200 too is an ASSUMPTION (no H100/H200 measurement was found).
MEM_EFF_GPT_FAST = 1700 / 2039
#
# All-reduce, cited for H200: ml-engineering, network/benchmarks/results/all-reduce-8xH200.md (8x H200 SXM,
# NVLink 4 / NVSwitch, torch.distributed + NCCL 2.27): algbw 22.82 GB/s at a 1 MiB payload (45.9 us) and
# 125.65 GB/s at 16 MiB (133.5 us). The line through those two points, t = 40 us + P / 180 GB/s, is within
# ~10% of every row from 32 KiB (40.0 us) to 16 MiB. It is an eager-mode NCCL measurement; vLLM's custom
# all-reduce and CUDA graphs are faster for small payloads, so this leans slow. Measured on 8 GPUs: using it
# for other TP degrees, and for H100 (same NVLink 4 / NVSwitch), is an ASSUMPTION. A100 (NVLink 3): the
# bandwidth scaled by 600/900 (NVLink 3 vs 4 bidirectional per GPU, datasheets, not in the facts file) is an
# ASSUMPTION, and so is keeping the same latency.
AR_LATENCY_S, AR_GB_PER_S = 40e-6, 180.0

A100 = Chip("A100 SXM 80GB", 312.0, 2039.0, 81_920, gemm_eff=0.869, attn_eff=0.60, mem_eff=MEM_EFF_GPT_FAST,
            allreduce_latency_s=AR_LATENCY_S, allreduce_gb_per_s=AR_GB_PER_S * 600 / 900)
H100 = Chip("H100 SXM", 989.0, 3350.0, 81_559, gemm_eff=0.803, attn_eff=0.75, mem_eff=MEM_EFF_GPT_FAST,
            allreduce_latency_s=AR_LATENCY_S, allreduce_gb_per_s=AR_GB_PER_S)
H200 = Chip("H200 SXM", 989.0, 4800.0, 143_771, gemm_eff=0.803, attn_eff=0.75, mem_eff=MEM_EFF_GPT_FAST,
            allreduce_latency_s=AR_LATENCY_S, allreduce_gb_per_s=AR_GB_PER_S)
CHIPS = {"A100": A100, "H100": H100, "H200": H200}

# Per-step overhead: ASSUMPTION, not measured or cited. It stands for the host-side work of a step
# (scheduling, input preparation, sampling, launching CUDA graphs) that an engine does not hide.
STEP_OVERHEAD_S = 0.3e-3

# ---------------------------------------------------------------- model shapes


@dataclass(frozen=True)
class ModelShape:
    """A Llama-style decoder's sizes (Hugging Face config.json names in comments); bytes per element of
    weights/activations (weight_bytes) and of the KV cache (kv_bytes): 2 for bf16."""
    name: str
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int
    hidden: int  # hidden_size
    intermediate: int  # intermediate_size
    vocab: int  # vocab_size
    tie_word_embeddings: bool = False
    weight_bytes: int = 2
    kv_bytes: int = 2


# layers, heads, kv heads, head_dim, hidden: reference-facts.md; intermediate_size and vocab_size: the
# models' config.json (meta-llama/Meta-Llama-3-8B and -70B; also solutions/l06_capacity_planning.py).
LLAMA_3_8B = ModelShape("Llama-3-8B", 32, 32, 8, 128, 4096, 14336, 128256)
LLAMA_3_70B = ModelShape("Llama-3-70B", 80, 64, 8, 128, 8192, 28672, 128256)
MODELS = {"llama-3-8b": LLAMA_3_8B, "llama-3-70b": LLAMA_3_70B}
# A speculative draft for them (same vocabulary): ModeledClock(..., draft_shape=LLAMA_3_2_1B) prices its forwards.
LLAMA_3_2_1B = ModelShape("Llama-3.2-1B", 16, 32, 8, 64, 2048, 8192, 128256, tie_word_embeddings=True)


def rank_dims(shape: ModelShape, tp: int = 1) -> dict:
    """Per-GPU sizes under tensor parallelism of degree tp (Megatron-style, as vLLM shards Llama):
    query heads, KV heads, intermediate size and vocab split across ranks; hidden is whole on every rank.
    Raises ValueError when one of them does not divide by tp."""
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    return dict(_memo(_rank_dims, shape, tp))  # a modeled clock asks for every kernel of every step


def _memo(cached, *args):
    """cached(*args) through its lru_cache, or computed afresh for arguments that cannot be hashed (a learner's
    shape-like object)."""
    try:
        return cached(*args)
    except TypeError:
        return cached.__wrapped__(*args)


@functools.lru_cache(maxsize=1024)
def _rank_dims(shape: ModelShape, tp: int) -> dict:
    dims = {"heads": shape.heads, "kv_heads": shape.kv_heads, "intermediate": shape.intermediate, "vocab": shape.vocab}
    for name, v in dims.items():
        if v % tp:
            raise ValueError(f"{shape.name}: {name}={v} does not split across tp={tp} ranks")
    return {k: v // tp for k, v in dims.items()}


def param_count(shape: ModelShape) -> int:
    """Parameters of the whole model: embeddings, per-layer attention + SwiGLU MLP + 2 norms, final norm,
    lm_head unless tied (lesson 06's count: param_count(LLAMA_3_8B) == 8_030_261_248)."""
    h, d = shape.hidden, shape.head_dim
    attention = h * shape.heads * d * 2 + h * shape.kv_heads * d * 2
    per_layer = attention + 3 * h * shape.intermediate + 2 * h
    lm_head = 0 if shape.tie_word_embeddings else shape.vocab * h
    return shape.layers * per_layer + shape.vocab * h + h + lm_head


def weight_bytes_per_rank(shape: ModelShape, tp: int = 1) -> float:
    """Bytes of weights one GPU holds: everything split tp ways except the norms (replicated, tiny)."""
    rank_dims(shape, tp)
    norms = (2 * shape.layers + 1) * shape.hidden
    return ((param_count(shape) - norms) / tp + norms) * shape.weight_bytes


def kv_bytes_per_token(shape: ModelShape, tp: int = 1) -> int:
    """KV-cache bytes one token occupies on one GPU: 2 (K, V) * layers * kv_heads / tp * head_dim * kv_bytes."""
    return 2 * shape.layers * rank_dims(shape, tp)["kv_heads"] * shape.head_dim * shape.kv_bytes

# ---------------------------------------------------------------- what a step holds


@dataclass(frozen=True)
class Composition:
    """One step's work. prefills: (tokens, context) per prefill chunk, context = that sequence's tokens
    already in the KV cache before the chunk. decodes: the context of each decode token (its sequence's
    cached tokens; the new token attends to context + 1 keys). logit_rows: rows lm_head computes; None (the
    default, and what a value equal to it becomes) = one per sequence. Speculative decoding's verification
    of k drafts is a chunk of k + 1 tokens that needs all k + 1 rows."""
    prefills: tuple[tuple[int, int], ...] = ()
    decodes: tuple[int, ...] = ()
    logit_rows: int | None = None

    def __post_init__(self):
        # (map and zip, not generator expressions: a batch of 256 decodes or prefill chunks is common, and the
        # modeled clock builds thousands of compositions in a search over batch sizes)
        pre = self.prefills
        if pre and set(map(len, pre)) != {2}:
            raise ValueError(f"each prefill chunk is (tokens, context), got {pre}")
        if not (type(pre) is tuple and set(map(type, pre)) <= {tuple} and set(map(type, chain.from_iterable(pre))) <= {int}):
            pre = tuple(zip(*(map(int, col) for col in zip(*pre)))) if pre else ()  # (as Python ints, bools out)
            object.__setattr__(self, "prefills", pre)
        if type(self.decodes) is not tuple or not set(map(type, self.decodes)) <= {int}:
            object.__setattr__(self, "decodes", tuple(map(int, self.decodes)))
        if (pre and (min(map(itemgetter(0), pre)) < 1 or min(map(itemgetter(1), pre)) < 0)) or \
                (self.decodes and min(self.decodes) < 0):
            raise ValueError(f"chunks need tokens >= 1 and contexts >= 0, got {self}")
        if self.logit_rows is not None:
            if not 0 <= int(self.logit_rows) <= self.num_tokens:
                raise ValueError(f"logit_rows must be in 0 .. num_tokens ({self.num_tokens}), got {self.logit_rows}")
            rows = int(self.logit_rows)
            object.__setattr__(self, "logit_rows", None if rows == self.num_seqs else rows)

    @classmethod
    def decode_batch(cls, batch: int, context: int, chunk: int = 0, chunk_context: int = 0) -> Composition:
        """`batch` decode tokens at `context` each, plus one prefill chunk of `chunk` tokens if chunk > 0."""
        return cls(prefills=((chunk, chunk_context),) if chunk else (), decodes=(context,) * batch)

    @classmethod
    def from_schedule(cls, so) -> Composition:
        """From the engine's SchedulerOutput, read before the step moves num_computed_tokens on."""
        return cls(prefills=tuple((s.num_tokens, s.seq.num_computed_tokens) for s in so.prefills),
                   decodes=tuple(s.seq.num_computed_tokens for s in so.decodes),
                   logit_rows=sum(max(1, s.num_logits) for s in so.scheduled))  # k + 1 for a verification

    @property
    def num_logit_rows(self) -> int:
        return self.num_seqs if self.logit_rows is None else self.logit_rows

    @property
    def num_prefill_tokens(self) -> int:
        return sum(map(itemgetter(0), self.prefills))

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + len(self.decodes)

    @property
    def num_seqs(self) -> int:
        return len(self.prefills) + len(self.decodes)

# ---------------------------------------------------------------- the cost of a step


@dataclass(frozen=True)
class KernelTime:
    """One kernel's share of a step, summed over its calls (per layer, per sequence).
    kind: "gemm" | "attention" | "allreduce"; bound: "compute" | "memory" | "network" (for attention summed
    over sequences: whichever term set most of its time); compute_s / memory_s: the two roofline terms."""
    name: str
    kind: str
    calls: int
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    time_s: float
    bound: str


@dataclass(frozen=True)
class StepTime:
    """step_time's answer: time_s (seconds) = sum of the kernels' time_s + overhead_s (0 for an empty step)."""
    composition: Composition
    kernels: tuple[KernelTime, ...]
    overhead_s: float
    time_s: float

    def seconds(self, kind: str) -> float:
        """Seconds spent in kernels of one kind ("gemm", "attention", "allreduce")."""
        return sum(k.time_s for k in self.kernels if k.kind == kind)

    def bound(self, kind: str) -> str | None:
        """Which bound, "compute" or "memory", sets most of the time of kernels of this kind ("network" for
        all-reduce; None if none ran)."""
        ks = [k for k in self.kernels if k.kind == kind]
        if not ks or kind == "allreduce":
            return "network" if ks else None
        compute = sum(k.time_s for k in ks if k.bound == "compute")
        return "compute" if compute > sum(k.time_s for k in ks) / 2 else "memory"

    def kernel(self, name: str) -> KernelTime:
        return next(k for k in self.kernels if k.name == name)


def matmul_cost(m: int, n: int, k: int, elem_bytes: float = 2) -> tuple[int, float]:
    """(FLOPs, bytes) of C[m, n] = A[m, k] @ B[k, n]: 2mnk FLOPs; A and B read once, C written once."""
    return 2 * m * n * k, (m * k + k * n + m * n) * elem_bytes


def roofline(flops: float, nbytes: float, peak_flops: float, bandwidth: float) -> tuple[float, float, float]:
    """(time, compute term, memory term) in seconds: the slower of FLOPs / peak and bytes / bandwidth."""
    compute, memory = flops / peak_flops, nbytes / bandwidth
    return max(compute, memory), compute, memory


def gemm_shapes(shape: ModelShape, tokens: int, logit_rows: int, tp: int = 1) -> list[tuple[str, int, int, int, int]]:
    """The weight GEMMs of one forward on one rank as (name, m, n, k, calls): C[m, n] = A[m, k] @ W[k, n].
    q/k/v and gate/up are fused (as vLLM does); lm_head runs on `logit_rows` rows (one per sequence, k + 1 for a
    sequence verifying k drafts)."""
    r, h, d = rank_dims(shape, tp), shape.hidden, shape.head_dim
    return [("qkv_proj", tokens, (r["heads"] + 2 * r["kv_heads"]) * d, h, shape.layers),
            ("o_proj", tokens, h, r["heads"] * d, shape.layers),
            ("gate_up_proj", tokens, 2 * r["intermediate"], h, shape.layers),
            ("down_proj", tokens, h, r["intermediate"], shape.layers),
            ("lm_head", logit_rows, r["vocab"], h, 1)]


def attention_cost(shape: ModelShape, tokens: int, context: int, tp: int = 1) -> tuple[int, int]:
    """(FLOPs, bytes) of attention for one sequence's `tokens` new tokens after `context` cached ones, all
    layers, one rank: 4 * head_dim FLOPs per (query, key) pair and query head; KV bytes = the cached K/V read
    once plus the new tokens' K/V written once (lesson 01's attention_flops / forward_bytes)."""
    r = rank_dims(shape, tp)
    keys_seen = tokens * context + tokens * (tokens + 1) // 2
    flops = 4 * shape.layers * r["heads"] * shape.head_dim * keys_seen
    return flops, (context + tokens) * kv_bytes_per_token(shape, tp)


def _gemm_kernels(shape, chip, comp, tp) -> list[KernelTime]:
    """One KernelTime per weight GEMM of gemm_shapes: each call's roofline at the chip's GEMM fractions, x calls."""
    # They depend on the step's token and logit-row counts only, and a replay repeats those all the time.
    return list(_memo(_gemm_kernels_of, shape, chip, comp.num_tokens, comp.num_logit_rows, tp))


@functools.lru_cache(maxsize=4096)
def _gemm_kernels_of(shape, chip, tokens: int, logit_rows: int, tp: int) -> tuple[KernelTime, ...]:
    peak, bw = chip.peak_flops * chip.gemm_eff, chip.bandwidth * chip.mem_eff
    out = []
    for name, m, n, k, calls in gemm_shapes(shape, tokens, logit_rows, tp):
        flops, nbytes = matmul_cost(m, n, k, shape.weight_bytes)
        t, c, mem = roofline(flops, nbytes, peak, bw)
        out.append(KernelTime(name, "gemm", calls, calls * flops, calls * nbytes, calls * c, calls * mem, calls * t,
                              "compute" if c >= mem else "memory"))
    return tuple(out)


def _attention_kernel(name, shape, chip, chunks, tp, counts: dict | None = None) -> KernelTime:
    """One attention launch over several sequences' chunks [(tokens, context)]: each sequence its own roofline.
    counts: {(tokens, context): how many such chunks} instead of the chunks, when the caller has it."""
    peak, bw = chip.peak_flops * chip.attn_eff, chip.bandwidth * chip.mem_eff
    flops = nbytes = compute = memory = total = compute_bound = 0.0
    counts = Counter(chunks) if counts is None else counts
    for (n, c), k in counts.items():  # equal chunks cost the same: a batch of 1024 is one roofline
        f, b = attention_cost(shape, n, c, tp)
        t, tc, tm = roofline(f, b, peak, bw)
        flops, nbytes, compute, memory, total = flops + k * f, nbytes + k * b, compute + k * tc, memory + k * tm, total + k * t
        compute_bound += k * t if tc >= tm else 0.0
    bound = "compute" if compute_bound > total / 2 else "memory"
    return KernelTime(name, "attention", sum(counts.values()) * shape.layers, flops, nbytes, compute, memory, total,
                      bound)


def _allreduce_kernel(shape, chip, comp, tp) -> KernelTime:
    """Two all-reduces per layer (after o_proj and down_proj) of tokens x hidden activations."""
    calls, payload = 2 * shape.layers, comp.num_tokens * shape.hidden * shape.weight_bytes
    per_call = chip.allreduce_latency_s + payload / (chip.allreduce_gb_per_s * 1e9)
    return KernelTime("all_reduce", "allreduce", calls, 0.0, calls * payload, 0.0, calls * per_call, calls * per_call,
                      "network")


def step_time(shape: ModelShape, chip: Chip, composition: Composition, *, tp: int = 1,
              overhead_s: float = STEP_OVERHEAD_S) -> StepTime:
    """Modeled seconds of one engine step of `composition` for `shape` on `chip`, tensor parallel over tp GPUs
    (each GPU runs its shard; the step takes one rank's time). Returns a StepTime with the per-kernel
    breakdown; an empty composition costs 0 s (no forward runs)."""
    if not composition.num_tokens:
        return StepTime(composition, (), 0.0, 0.0)
    kernels = _gemm_kernels(shape, chip, composition, tp)
    if composition.decodes:
        counts = {(1, c): k for c, k in Counter(composition.decodes).items()}  # one token each, at its context
        kernels.append(_attention_kernel("attn_decode", shape, chip, None, tp, counts))
    if composition.prefills:
        kernels.append(_attention_kernel("attn_prefill", shape, chip, composition.prefills, tp))
    if tp > 1:
        kernels.append(_allreduce_kernel(shape, chip, composition, tp))
    return StepTime(composition, tuple(kernels), overhead_s, sum(k.time_s for k in kernels) + overhead_s)

# ---------------------------------------------------------------- the clock and the engine's KV capacity


class ModeledClock:
    """A clock for LLMEngine(clock=...): calling it returns modeled seconds (from `start`). The engine calls
    advance() once per step that runs a forward, which moves time on by step_time of that step; nothing else
    moves it but advance_to(), which a caller waiting for the next arrival uses to pass idle time (replay.py),
    and advance_draft(), once per forward of a speculative draft model. `steps` keeps every StepTime of the
    target, in order; `draft_steps` those of the draft.

    draft_shape: the shape the draft model's forwards are priced at (e.g. LLAMA_3_2_1B for a Llama-3 target).
    None: they are not priced (the tiny shipped draft has no GPU-sized counterpart to assume), and
    `uncharged_draft_forwards` counts them, so a caller can tell."""

    def __init__(self, shape: ModelShape, chip: Chip, *, tp: int = 1, overhead_s: float = STEP_OVERHEAD_S,
                 start: float = 0.0, draft_shape: ModelShape | None = None):
        rank_dims(shape, tp)
        if draft_shape is not None:
            rank_dims(draft_shape, tp)
        self.shape, self.chip, self.tp, self.overhead_s = shape, chip, tp, overhead_s
        self.draft_shape = draft_shape
        self.now = float(start)
        self.steps: list[StepTime] = []
        self.draft_steps: list[StepTime] = []
        self.uncharged_draft_forwards = 0
        self.capacity: dict | None = None  # set by engine_kwargs: the modeled KV capacity and the cap applied

    def __call__(self) -> float:
        return self.now

    def advance(self, composition) -> StepTime:
        """Move time on by one step: `composition` is a Composition or the engine's SchedulerOutput
        (read before the step updates num_computed_tokens). Returns the step's StepTime."""
        return self._charge(self.shape, composition, self.overhead_s, self.steps)

    def _charge(self, shape: ModelShape, composition, overhead_s: float, log: list) -> StepTime:
        """Price one forward of `shape` (a Composition, or a SchedulerOutput read as one), move time on by it,
        and keep its StepTime in `log`."""
        if not isinstance(composition, Composition):
            composition = Composition.from_schedule(composition)
        st = step_time(shape, self.chip, composition, tp=self.tp, overhead_s=overhead_s)
        self.now += st.time_s
        log.append(st)
        return st

    def advance_to(self, t: float) -> None:
        """Idle time: move now on to t (never back; the GPU idles, no step runs)."""
        self.now = max(self.now, float(t))

    def advance_draft(self, composition) -> StepTime | None:
        """One forward of the speculative draft model (spec_decode.DraftModelProposer calls it per draft
        position, before the target's step): priced at draft_shape on the same chip and tp, with no fixed
        overhead of its own (it runs inside the target's step, whose overhead advance() charges). Returns
        its StepTime; None, and nothing charged, without a draft_shape."""
        if self.draft_shape is None:
            self.uncharged_draft_forwards += 1
            return None
        return self._charge(self.draft_shape, composition, 0.0, self.draft_steps)

    def __repr__(self):
        return f"ModeledClock({self.shape.name} on {self.chip.name}, tp={self.tp}, now={self.now:.6f} s)"


def kv_capacity(shape: ModelShape, chip: Chip, *, tp: int = 1, gpu_memory_utilization: float = 0.9,
                block_size: int = 16) -> dict:
    """The KV cache one GPU of the modeled deployment holds, as vLLM sizes it at startup (minus nothing for
    activations or CUDA graphs, which vLLM profiles; so an upper bound): memory as the driver reports it
    * gpu_memory_utilization - weights per GPU. Returns bytes (total, weights, free), kv_bytes_per_token,
    tokens and blocks (of block_size tokens). Raises ValueError when the weights do not fit."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    weights = weight_bytes_per_rank(shape, tp)
    free = chip.memory_bytes * gpu_memory_utilization - weights
    if free <= 0:
        raise ValueError(f"{shape.name} on {chip.name} with tp={tp}: {weights / 1e9:.1f} GB of weights per GPU leave "
                         f"no KV cache in {gpu_memory_utilization:.0%} of {chip.memory_mib} MiB")
    per_token = kv_bytes_per_token(shape, tp)
    tokens = int(free // per_token)
    return {"total_bytes": chip.memory_bytes, "weights_bytes": weights, "free_bytes": free,
            "kv_bytes_per_token": per_token, "tokens": tokens, "blocks": tokens // block_size}


DEFAULT_MAX_BLOCKS = 4096  # 64 Ki tokens: the shipped tiny model's fp32 cache is then 128 MiB of RAM


def engine_kwargs(shape: ModelShape, chip: Chip, tp: int = 1, gpu_memory_utilization: float = 0.9,
                  max_blocks: int | None = DEFAULT_MAX_BLOCKS, *, block_size: int = 16,
                  overhead_s: float = STEP_OVERHEAD_S, draft_shape: ModelShape | None = None) -> dict:
    """Keyword arguments for LLM(...) / LLMEngine(...) that make a run report modeled GPU time:
    {"clock": ModeledClock, "num_blocks": ..., "block_size": block_size}. num_blocks is the block count the
    modeled GPU's free memory would hold (kv_capacity), so the scheduler admits and preempts as it would
    there; capped at max_blocks (None: no cap) so the real cache of the small model stays small in RAM.
    When capped it warns, and clock.capacity records both numbers."""
    cap = kv_capacity(shape, chip, tp=tp, gpu_memory_utilization=gpu_memory_utilization, block_size=block_size)
    num_blocks = cap["blocks"] if max_blocks is None else min(cap["blocks"], max_blocks)
    capped = num_blocks < cap["blocks"]
    if capped:
        warnings.warn(f"{shape.name} on {chip.name} (tp={tp}) would hold {cap['blocks']} KV blocks of {block_size} "
                      f"tokens; capped at max_blocks={max_blocks}, so the scheduler sees less KV capacity than the "
                      "modeled GPU has (preemption comes sooner)", stacklevel=2)
    clock = ModeledClock(shape, chip, tp=tp, overhead_s=overhead_s, draft_shape=draft_shape)
    clock.capacity = {**cap, "num_blocks": num_blocks, "capped": capped}
    return {"clock": clock, "num_blocks": num_blocks, "block_size": block_size}

# ---------------------------------------------------------------- the table (python -m reference_engine.sim.gpu_model)


def _row(label: int, st: StepTime, last: str) -> str:
    return (f"{label:>6} {st.time_s * 1e3:>8.2f} {st.seconds('gemm') * 1e3:>8.2f} {st.seconds('attention') * 1e3:>8.2f} "
            f"{st.seconds('allreduce') * 1e3:>7.2f}  {st.bound('gemm'):<8} {st.bound('attention'):<8} {last:>9}")


def table(shape: ModelShape, chip: Chip, *, tp: int = 1, context: int = 1024, batch: int = 64,
          batches=(1, 8, 32, 64, 128, 256, 512), chunks=(0, 64, 128, 256, 512, 1024, 2048)) -> str:
    """The text python -m reference_engine.sim.gpu_model prints: step time vs decode batch (every sequence at
    `context`), then vs a prefill chunk (context 0) riding on a decode batch of `batch`."""
    cap = kv_capacity(shape, chip, tp=tp)
    lines = [f"{shape.name} on {chip.name}, tp={tp}: {chip.dense_tflops:g} TFLOP/s x {chip.gemm_eff} (GEMM), "
             f"x {chip.attn_eff} (attention); {chip.hbm_gb_per_s:g} GB/s x {chip.mem_eff:.3f}; "
             f"GEMM ridge {chip.ridge:.0f} FLOP/byte; step overhead {STEP_OVERHEAD_S * 1e3:g} ms",
             f"KV cache per GPU at gpu_memory_utilization 0.9 of {chip.memory_mib} MiB: {cap['tokens']:,} tokens",
             "", f"Decode batch, every sequence at context {context}:",
             " batch  step ms  GEMM ms  attn ms   AR ms  GEMM     attn         tok/s"]
    for b in batches:
        st = step_time(shape, chip, Composition.decode_batch(b, context), tp=tp)
        lines.append(_row(b, st, f"{b / st.time_s:.0f}"))
    base = step_time(shape, chip, Composition.decode_batch(batch, context), tp=tp)
    lines += ["", f"Prefill chunk (context 0) riding on a decode batch of {batch} at context {context}:",
              " chunk  step ms  GEMM ms  attn ms   AR ms  GEMM     attn      +ms vs 0"]
    for c in chunks:
        st = step_time(shape, chip, Composition.decode_batch(batch, context, c), tp=tp)
        prefill = st.kernel("attn_prefill").bound if c else "-"
        lines.append(_row(c, st, f"{(st.time_s - base.time_s) * 1e3:.2f}") + f"   (prefill attn {prefill})")
    lines += ["", "GEMM / attn: the bound that sets most of that kind's time (attn: decode + prefill attention); "
              "AR: all-reduce."]
    return "\n".join(lines)

# ---------------------------------------------------------------- calibration against a real GPU


def _chip_of_device(name: str, default: Chip) -> Chip:
    for key, chip in CHIPS.items():
        if key in name.upper():
            return chip
    return default


def _time_rotating(fn, args_pool, device, repeats: int = 20, per_window: int = 10) -> float:
    """Seconds per call of fn(*args), cycling through args_pool so operands are not sitting in L2.

    On CUDA: the median over `repeats` windows of `per_window` calls queued back to back between two events,
    queued while the GPU is held busy (torch.cuda._sleep), so that it finds them all waiting. One call between
    two events on an idle GPU would also time the host's launch of that call (tens of microseconds, more than
    a small kernel takes); queued, the GPU runs the kernels back to back, as it runs a captured CUDA graph.
    """
    import time

    import torch

    cuda = device.type == "cuda"
    fn(*args_pool[0])
    times = []
    for i in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(2_000_000)  # about a millisecond: longer than the host takes to queue the window
            start.record()
            for j in range(per_window):
                fn(*args_pool[(i * per_window + j) % len(args_pool)])
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3 / per_window)
        else:
            t0 = time.perf_counter()
            fn(*args_pool[i % len(args_pool)])
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _pool(make, one_bytes: float, pool_bytes: float, budget_bytes: float) -> list:
    """Enough copies of make() to exceed pool_bytes (defeating L2), as long as they fit budget_bytes."""
    count = max(1, min(math.ceil(pool_bytes / one_bytes), int(budget_bytes // one_bytes)))
    return [make() for _ in range(count)]


def _measure_gemm(m: int, n: int, k: int, device, dtype, pool_bytes: float, budget_bytes: float) -> float:
    """Median seconds of A[m, k] @ W[k, n], W cycling through copies larger than L2 in all."""
    import torch

    a = torch.randn(m, k, device=device, dtype=dtype)
    pool = _pool(lambda: (a, torch.randn(k, n, device=device, dtype=dtype)), k * n * 2, pool_bytes, budget_bytes)
    return _time_rotating(torch.matmul, pool, device)


def _measure_decode_attention(b: int, kv_heads: int, group: int, context: int, d: int, device, dtype,
                              pool_bytes: float, budget_bytes: float) -> float:
    """Median seconds of GQA decode attention of b sequences at `context` keys (one layer, one rank),
    written as plain attention: the `group` query heads sharing a KV head are `group` query rows against it."""
    import torch
    import torch.nn.functional as F

    q = torch.randn(b, kv_heads, group, d, device=device, dtype=dtype)

    def make():
        return (q, *(torch.randn(b, kv_heads, context, d, device=device, dtype=dtype) for _ in range(2)))

    pool = _pool(make, b * kv_heads * context * d * 2 * 2, pool_bytes, budget_bytes)
    return _time_rotating(F.scaled_dot_product_attention, pool, device)


def _measure_prefill_attention(n: int, heads: int, d: int, device, dtype) -> float:
    """Median seconds of causal attention of an n-token chunk with no context (KV heads repeated to the query
    heads: the chunk is compute-bound, so the extra K/V bytes barely matter)."""
    import functools

    import torch
    import torch.nn.functional as F

    q, k, v = (torch.randn(1, heads, n, d, device=device, dtype=dtype) for _ in range(3))
    return _time_rotating(functools.partial(F.scaled_dot_product_attention, is_causal=True), [(q, k, v)], device)


def calibrate(shape: ModelShape, chip: Chip, *, tp: int = 1, context: int = 1024, batches=(1, 16, 64, 256),
              chunks=(256, 1024), device=None, budget_bytes: float = 8e9, pool_bytes: float = 256 * MiB) -> list[dict]:
    """Time one layer's real kernels of this shape (one rank's shard) and compare each with the model.

    For each decode batch B: the four weight GEMMs at m = B and decode attention of B sequences at `context`
    keys; for each chunk n: the GEMMs at m = n and causal prefill attention of n tokens (context 0). Scaled
    down to fit: a decode batch whose K/V would exceed budget_bytes is timed at a smaller B (the row says so).
    Modeled times use chip's fractions, one layer. Returns rows {kernel, shape, modeled_s, measured_s}.
    """
    import torch

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    r, d, rows = rank_dims(shape, tp), shape.head_dim, []
    one_layer = replace(shape, layers=1)
    for m in [*batches, *chunks]:
        for name, mm, n, k, _ in gemm_shapes(shape, m, m, tp)[:4]:
            modeled = roofline(*matmul_cost(mm, n, k, shape.weight_bytes), chip.peak_flops * chip.gemm_eff,
                               chip.bandwidth * chip.mem_eff)[0]
            measured = _measure_gemm(mm, n, k, device, dtype, pool_bytes, budget_bytes)
            rows.append({"kernel": name, "shape": f"{mm}x{n}x{k}", "modeled_s": modeled, "measured_s": measured})
    for b in batches:
        fit = max(1, min(b, int(budget_bytes // (r["kv_heads"] * context * d * 2 * 2))))
        modeled = _attention_kernel("attn_decode", one_layer, chip, [(1, context - 1)] * fit, tp).time_s
        measured = _measure_decode_attention(fit, r["kv_heads"], r["heads"] // r["kv_heads"], context, d, device,
                                             dtype, pool_bytes, budget_bytes)
        rows.append({"kernel": "attn_decode", "shape": f"B={fit}{'' if fit == b else f' (of {b})'} ctx={context}",
                     "modeled_s": modeled, "measured_s": measured})
    for n in chunks:
        modeled = _attention_kernel("attn_prefill", one_layer, chip, [(n, 0)], tp).time_s
        measured = _measure_prefill_attention(n, r["heads"], d, device, dtype)
        rows.append({"kernel": "attn_prefill", "shape": f"n={n} ctx=0", "modeled_s": modeled, "measured_s": measured})
    return rows


def _calibration_text(rows: list[dict], chip: Chip, device_name: str) -> str:
    lines = [f"{device_name}, modeled as {chip.name}; one layer, one rank", f"{'kernel':<14}{'shape':<26}"
             f"{'modeled us':>11}{'measured us':>12}{'meas/model':>11}"]
    for r in rows:
        lines.append(f"{r['kernel']:<14}{r['shape']:<26}{r['modeled_s'] * 1e6:>11.1f}{r['measured_s'] * 1e6:>12.1f}"
                     f"{r['measured_s'] / r['modeled_s']:>11.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    """CLI: the step-time table, or with --calibrate the modeled-vs-measured kernels (CUDA only)."""
    p = argparse.ArgumentParser(prog="python -m reference_engine.sim.gpu_model", description=__doc__.split("\n")[0])
    p.add_argument("--chip", default="H100", type=str.upper, choices=sorted(CHIPS))
    p.add_argument("--model", default="llama-3-8b", type=str.lower, choices=sorted(MODELS))
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--context", type=int, default=1024, help="context of every decode sequence")
    p.add_argument("--batch", type=int, default=64, help="decode batch the prefill chunks ride on")
    p.add_argument("--calibrate", action="store_true", help="time real kernels of these shapes (needs CUDA)")
    args = p.parse_args(argv)
    shape, chip = MODELS[args.model], CHIPS[args.chip]
    if not args.calibrate:
        try:
            print(table(shape, chip, tp=args.tp, context=args.context, batch=args.batch))
        except ValueError as e:  # a TP degree that does not divide the heads, or weights that do not fit
            p.error(str(e))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("not graded here: needs a CUDA GPU")
        return 0
    name = torch.cuda.get_device_name()
    chip = _chip_of_device(name, chip)
    print(_calibration_text(calibrate(shape, chip, tp=args.tp, context=args.context), chip, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
