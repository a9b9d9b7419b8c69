"""Checks for lesson 02: KV bytes per token, cache sizing, and a KV cache with GQA attention.

Hidden cases draw configs the learner has not seen: random layer counts, heads, kv heads that
divide the heads, head_dim present, absent or null, num_key_value_heads present, absent or null
(autograder/checks/_configs.py). A config with both fields null is a visible case, so that trap is
met on every seed. Attention is checked against torch's scaled_dot_product_attention on K/V expanded with
repeat_interleave, with an explicit causal mask aligned to the end of the cache.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from autograder.checks import _attention
from autograder.checks._configs import NULL_FIELDS_7B, call, describe, non_default, random_config, shape
from autograder.compare import compare
from autograder.core import LearnerRaised, check
from autograder.reference import answer_code

# -- configs ----------------------------------------------------------------------------------

DTYPE_SPECS = ["bfloat16", "float16", "fp16", "bf16", "float8", "fp8", "fp8_e4m3", "fp8_e5m2",
               "float32", "fp32", 1, 2, 4, torch.bfloat16, torch.float16, torch.float32]
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "float8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@answer_code
def kv_mistakes(cfg, nbytes: int) -> dict:
    s = shape(cfg)
    right = 2 * s.layers * s.kv_heads * s.head_dim * nbytes
    wrong = {"counts only K, not K and V": right // 2,
             "ignores num_key_value_heads (uses num_attention_heads)": 2 * s.layers * s.heads * s.head_dim * nbytes,
             "uses hidden_size instead of num_key_value_heads * head_dim": 2 * s.layers * cfg["hidden_size"] * nbytes,
             "ignores an explicit head_dim (uses hidden_size // num_attention_heads)":
                 2 * s.layers * s.kv_heads * s.implied_head_dim * nbytes,
             "forgets the number of layers": 2 * s.kv_heads * s.head_dim * nbytes,
             "uses bits instead of bytes": right * 8}
    if cfg.get("torch_dtype") in DTYPE_BYTES and DTYPE_BYTES[cfg["torch_dtype"]] != nbytes:
        wrong["uses the config's torch_dtype instead of the dtype argument (the KV cache may differ "
              "from the weights)"] = 2 * s.layers * s.kv_heads * s.head_dim * DTYPE_BYTES[cfg["torch_dtype"]]
    return wrong


LLAMA_3_70B = {"model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64,
               "num_key_value_heads": 8, "hidden_size": 8192, "intermediate_size": 28672,
               "vocab_size": 128256, "torch_dtype": "bfloat16"}
LLAMA_3_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336,
              "vocab_size": 128256, "torch_dtype": "bfloat16"}
MHA_7B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
          "hidden_size": 4096, "intermediate_size": 11008, "vocab_size": 32000}
EXPLICIT_HEAD_DIM = {"model_type": "mistral", "num_hidden_layers": 40, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120,
                     "intermediate_size": 14336, "vocab_size": 131072}


@answer_code
def _width(spec) -> int:
    """Bytes per element of a dtype spec, for drawing cases (the expected values are t.ref's)."""
    if isinstance(spec, torch.dtype):
        return spec.itemsize
    return DTYPE_BYTES[spec.lower()] if isinstance(spec, str) else spec


# -- 2.1 bytes per token ----------------------------------------------------------------------

def rng_case(rng, name: str) -> str:
    """The same name in a random mix of upper and lower case (names are case-insensitive)."""
    return "".join(c.upper() if rng.random() < 0.5 else c for c in name)


def _refused(t, spec, why: str):
    """dtype_bytes(spec) must raise ValueError; returning a width is named when the usual mistake explains it."""
    got, raised = t.attempt(t.call, "dtype_bytes", spec)
    if raised:
        if not raised.is_a(ValueError):
            t.fail(f"dtype_bytes({spec!r}) raised {raised.type_name}, expected ValueError: {why}")
        return
    if spec is True and got == 1:
        t.fail("dtype_bytes(True) returned 1.", "accepts a bool as a byte width: bool is a subclass of int "
               "(isinstance(True, int) is True), so test for bool before int, and refuse it")
    t.fail(f"dtype_bytes({spec!r}) returned {got!r} instead of raising ValueError: {why}")


@check(points=1, section="2.1")
def dtype_bytes(t):
    """Bytes per element from a dtype name, a byte width or a torch.dtype; anything else refused."""
    # every short name and torch.dtypes of each width (fp8 and float64 too), on every seed
    visible = ["bfloat16", "float16", "float32", "fp8_e4m3", "float8", "FP8_E4M3", "BFloat16", "bf16", "fp16", "fp8",
               "fp32", 2, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float64]
    names = ["bf16", "fp16", "fp8", "fp8_e5m2", "fp32", "bfloat16", "float8"]
    for spec in t.cases(visible, lambda rng: rng_case(rng, rng.choice(names)), n=3):
        with t.case(f"dtype_bytes({spec!r})"):
            expected = t.ref.dtype_bytes(spec)
            try:
                got = t.call("dtype_bytes", spec)
            except LearnerRaised as e:
                if isinstance(spec, str) and spec != spec.lower() and e.is_a(ValueError):
                    t.fail(f"dtype_bytes({spec!r}) raised ValueError.", "matches names case-sensitively: names are "
                           "case-insensitive, compare spec.lower()")
                raise
            t.expect(got, expected, f"bytes per {spec!r} element", mistakes={"uses bits instead of bytes": 8 * expected})
    refused = [("an unknown name", "int3", "a typo in a dtype name must not silently size a cache"),
               ("16 is not a byte width", 16, "a width is 1, 2, 4 or 8 bytes; 16 is bf16's width in bits"),
               ("True is not a byte width", True, "a bool is not a width, though Python counts it as an int")]
    for label, spec, why in refused:
        with t.case(f"{label}: dtype_bytes({spec!r}) raises ValueError"):
            _refused(t, spec, why)


def _config_cases(t, visible: list, hidden, n: int) -> list:
    """(label with the config described, cfg, *rest) for visible (label, cfg, *rest) tuples and `n`
    hidden ones drawn by hidden(rng) -> (cfg, *rest)."""
    return [(f"{label}: {describe(case[0])}", *case)
            for label, case in t.cases([(v[0], v[1:]) for v in visible], hidden, n=n)]


def blame_upstream(t, what: str, got, expected, upstream: list[tuple[str, tuple, object]]) -> None:
    """Before `what`'s wrong answer is judged: the first exercise it builds on (upstream: (name, the arguments the
    reference passes it here, the reference's value), in call order) that is wrong on those arguments fails the
    case, named (t.blame_upstream): each check judges its own function. A config is shown as the case labels show
    it."""
    if compare(got, expected) is not None:
        for name, args, value in upstream:
            shown = ", ".join(f"{{{describe(a)}}}" if isinstance(a, dict) else repr(a) for a in args)
            t.blame_upstream(what, name, [(args, value)], rtol=None, shown=shown)


@check(points=3, section="2.1")
def kv_bytes_per_token(t):
    """2 x layers x kv_heads x head_dim x bytes, with config.json's defaults."""
    visible = [("GQA, explicit head_dim 128 while hidden_size // heads = 160", EXPLICIT_HEAD_DIM, "bfloat16"),
               ("Llama-3-70B config, fp8 cache", LLAMA_3_70B, "fp8_e4m3"),
               ("MHA config without num_key_value_heads", MHA_7B, "float16"),
               ("MHA config with num_key_value_heads and head_dim both null", NULL_FIELDS_7B, "bfloat16"),
               ("Llama-3-8B config, byte width 4", LLAMA_3_8B, 4)]
    hidden = lambda rng: (random_config(rng), rng.choice(DTYPE_SPECS))  # noqa: E731
    for label, cfg, dtype in _config_cases(t, visible, hidden, n=4):
        with t.case(f"{label}, dtype={dtype!r}"):
            expected, width = t.ref.kv_bytes_per_token(cfg, dtype), t.ref.dtype_bytes(dtype)
            got = call(t, "kv_bytes_per_token", cfg, dtype)
            blame_upstream(t, "kv_bytes_per_token", got, expected, [("dtype_bytes", (dtype,), width)])
            t.expect(got, expected, "KV bytes per token", mistakes=kv_mistakes(cfg, width), count=True)


# -- 2.2 users and bytes ----------------------------------------------------------------------

@check(points=1, section="2.2")
def kv_cache_bytes(t):
    """users x context x bytes per token."""
    visible = [("Llama-3-70B", LLAMA_3_70B, "bfloat16", 32, 8192), ("Llama-3-8B", LLAMA_3_8B, "fp8", 7, 3000)]
    hidden = lambda rng: (random_config(rng), rng.choice(DTYPE_SPECS), rng.randint(2, 256),  # noqa: E731
                          rng.randint(2, 131072))
    for label, cfg, dtype, users, ctx in _config_cases(t, visible, hidden, n=3):
        with t.case(f"{users} users x {ctx} tokens, {label}, dtype={dtype!r}"):
            expected = t.ref.kv_cache_bytes(cfg, dtype, users, ctx)
            per_token = t.ref.kv_bytes_per_token(cfg, dtype)
            got = call(t, "kv_cache_bytes", cfg, dtype, users, ctx)
            blame_upstream(t, "kv_cache_bytes", got, expected, [("kv_bytes_per_token", (cfg, dtype), per_token)])
            t.expect(got, expected, "cache bytes", count=True,
                     mistakes={"forgets to multiply by the number of users": per_token * ctx,
                               "forgets the context length": per_token * users,
                               "counts only K, not K and V": expected // 2})


def _rounding_mistakes(free: float, per_user: float) -> dict:
    """The wrong ways to turn free / per_user into a count of whole sequences."""
    if free <= 0:
        return {}
    why = "(a sequence that does not fit entirely cannot be admitted)"
    x = free / per_user
    wrong = {f"rounds up {why}": math.ceil(x), f"rounds to the nearest whole number instead of down {why}": round(x)}
    if abs(x - round(x)) > 1e-6:  # else the fraction cannot be told from a whole number
        wrong["returns a fraction of a user (round down to whole sequences)"] = x
    return wrong


@check(points=2, section="2.2")
def max_users(t):
    """Whole sequences that fit in the free bytes: rounded down, never negative."""
    per_70b = t.ref.kv_cache_bytes(LLAMA_3_70B, "bfloat16", 1, 8192)
    per_8b = t.ref.kv_cache_bytes(LLAMA_3_8B, "fp8", 1, 4096)
    visible = [("70.45e9 free bytes", LLAMA_3_70B, "bfloat16", 8192, 70.45e9),
               ("one byte short of 5 sequences", LLAMA_3_70B, "bfloat16", 8192, 5 * per_70b - 1),
               ("room for 6.7 sequences", LLAMA_3_8B, "fp8", 4096, int(6.7 * per_8b)),
               ("room for 6.3 sequences", LLAMA_3_8B, "fp8", 4096, int(6.3 * per_8b)),
               ("exactly 3 sequences", LLAMA_3_8B, "fp8", 4096, 3 * per_8b),
               ("negative free memory (weights did not fit)", LLAMA_3_8B, "bfloat16", 4096, -2e9)]

    def hidden(rng):
        cfg, dtype, ctx = random_config(rng), rng.choice(DTYPE_SPECS), rng.randint(256, 131072)
        s = shape(cfg)
        return cfg, dtype, ctx, rng.uniform(0.3, 300) * 2 * s.layers * s.kv_heads * s.head_dim * ctx * _width(dtype)
    for label, cfg, dtype, ctx, free in _config_cases(t, visible, hidden, n=3):
        with t.case(f"{label}, context {ctx}, free={free:.6g} bytes, dtype={dtype!r}"):
            expected = t.ref.max_users(cfg, dtype, ctx, free)
            per_user = t.ref.kv_cache_bytes(cfg, dtype, 1, ctx)
            per_token = t.ref.kv_bytes_per_token(cfg, dtype)
            wrong = _rounding_mistakes(free, per_user)
            wrong["counts tokens that fit, not sequences of context_len tokens"] = int(free // per_token)
            wrong["returns a negative number of users when nothing fits"] = int(free // per_user)
            got = call(t, "max_users", cfg, dtype, ctx, free)
            blame_upstream(t, "max_users", got, expected, [("kv_cache_bytes", (cfg, dtype, 1, ctx), per_user)])
            t.expect(got, expected, "users that fit", mistakes=wrong, count=True)


@check(points=2, section="2.3")
def users_per_gpu(t):
    """Weights first, then whole sequences of KV cache in what is left."""
    visible = [("Llama-3-8B, bf16 (the defaults), 80 GB", LLAMA_3_8B, 8.03e9, 8192, 80e9, "bfloat16", "bfloat16"),
               ("Llama-3-70B, fp8 weights, bf16 cache, 141 GB", LLAMA_3_70B, 70.55e9, 8192, 141e9, "fp8", "bfloat16"),
               ("Llama-3-70B, bf16 weights, 141 GB", LLAMA_3_70B, 70.55e9, 8192, 141e9, "bfloat16", "bfloat16"),
               ("Llama-3-8B, bf16 weights, fp8 cache, 80 GB", LLAMA_3_8B, 8.03e9, 32768, 80e9, "bfloat16", "fp8"),
               ("MHA, 1-byte weights, fp16 cache, 24 GB", MHA_7B, 6.74e9, 4096, 24e9, 1, "float16")]

    def hidden(rng):
        return (random_config(rng), rng.uniform(1, 100) * 1e9, rng.randint(1024, 65536),
                rng.choice([24e9, 48e9, 80e9, 141e9, 192e9]), rng.choice(["bfloat16", "fp8", 2, 1]),
                rng.choice(["bfloat16", "fp8", "float16"]))
    for label, cfg, params, ctx, gpu, w_dt, kv_dt in _config_cases(t, visible, hidden, n=2):
        with t.case(f"{params:.4g} params, context {ctx}, gpu_bytes={gpu:.4g}, weights {w_dt!r}, "
                    f"cache {kv_dt!r}, {label}"):
            expected = t.ref.users_per_gpu(cfg, params, ctx, gpu, w_dt, kv_dt)
            per_user = t.ref.kv_cache_bytes(cfg, kv_dt, 1, ctx)
            free = gpu - params * t.ref.dtype_bytes(w_dt)
            wrong = {"forgets to subtract the weights": int(gpu // per_user),
                     "returns a negative number of users when the weights do not fit": int(free // per_user),
                     "sizes the weights with the KV cache's dtype":
                         max(0, int((gpu - params * t.ref.dtype_bytes(kv_dt)) // per_user)),
                     "sizes the KV cache with the weights' dtype":
                         t.ref.max_users(cfg, w_dt, ctx, free)}
            # bf16 weights and cache are the defaults: leave them out, as a caller would
            got = call(t, "users_per_gpu", cfg, params, ctx, gpu,
                       **non_default(weight_dtype=(w_dt, "bfloat16"), kv_dtype=(kv_dt, "bfloat16")))
            blame_upstream(t, "users_per_gpu", got, expected,
                           [("dtype_bytes", (w_dt,), t.ref.dtype_bytes(w_dt)),
                            ("max_users", (cfg, kv_dt, ctx, free), t.ref.max_users(cfg, kv_dt, ctx, free))])
            t.expect(got, expected, "users per GPU", mistakes=wrong, count=True)


# -- 2.4 attention over the cache -------------------------------------------------------------

@answer_code
def sdpa_reference(q, k, v):
    """Expected output: SDPA over K/V expanded with repeat_interleave, causal mask aligned to the
    end (query i is token S - T + i). SDPA's own is_causal aligns top-left when T != S."""
    T, H, D = q.shape
    S, H_kv, _ = k.shape
    g = H // H_kv
    ke, ve = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    mask = torch.arange(S)[None, :] <= torch.arange(S - T, S)[:, None]     # [T, S], True = attend
    out = F.scaled_dot_product_attention(q.transpose(0, 1), ke.transpose(0, 1), ve.transpose(0, 1),
                                         attn_mask=mask)
    return out.transpose(0, 1).contiguous()


@answer_code
def attention_variant(q, k, v, scale=True, heads="interleave", mask="end", softmax_over="keys"):
    """The typical wrong versions of decode attention, for naming mistakes."""
    T, H, D = q.shape
    S, H_kv, _ = k.shape
    g = H // H_kv
    if heads == "interleave":
        ke, ve = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    else:  # head h reads kv head h % H_kv
        ke, ve = k.repeat(1, g, 1), v.repeat(1, g, 1)
    s = torch.einsum("thd,shd->ths", q, ke)
    if scale:
        s = s / math.sqrt(D)
    q_pos = torch.arange(S - T, S) if mask == "end" else torch.arange(T)
    if mask != "none":
        s = s.masked_fill(torch.arange(S)[None, None, :] > q_pos[:, None, None], float("-inf"))
    p = s.softmax(dim={"keys": -1, "queries": 0, "heads": 1}[softmax_over])
    return torch.einsum("ths,shd->thd", torch.nan_to_num(p), ve)


@answer_code
def attention_mistakes(q, k, v) -> dict:
    T, H, _ = q.shape
    S, H_kv, _ = k.shape
    m = {"is missing the 1/sqrt(head_dim) scale": attention_variant(q, k, v, scale=False)}
    if H_kv > 1 and H > H_kv:
        m["maps query heads to KV heads with repeat instead of repeat_interleave "
          "(query head h must read KV head h // group)"] = attention_variant(q, k, v, heads="repeat")
    if T > 1:
        m["applies no causal mask to the new tokens (query i must not see the tokens after it)"] = \
            attention_variant(q, k, v, mask="none")
    if T < S:
        m["aligns the causal mask top-left (query i sees keys 0..i), but the T new queries are the "
          "last T tokens: query i sees keys 0..S-T+i"] = attention_variant(q, k, v, mask="start")
    m["takes the softmax over the wrong axis (over queries instead of keys)"] = \
        attention_variant(q, k, v, softmax_over="queries")
    m["takes the softmax over the wrong axis (over heads instead of keys)"] = \
        attention_variant(q, k, v, softmax_over="heads")
    return m


def _qkv(t, T, S, H, H_kv, D):
    return (torch.randn(T, H, D, generator=t.gen), torch.randn(S, H_kv, D, generator=t.gen),
            torch.randn(S, H_kv, D, generator=t.gen))


@check(points=3, section="2.4")
def decode_attention(t):
    """GQA attention of the T newest queries over S cached keys and values, causal; bf16 in, bf16 out."""
    visible = [("decode step, MHA", (1, 7, 4, 4, 16)), ("decode step, GQA group 4", (1, 9, 8, 2, 16)),
               ("4 new tokens over 10 cached, GQA group 2", (4, 10, 4, 2, 8)),
               ("prefill T = S = 6, GQA group 2", (6, 6, 4, 2, 8))]

    def hidden(rng):
        H_kv, g, S = rng.randint(1, 4), rng.choice([1, 2, 4, 8]), rng.randint(1, 48)
        return rng.choice([1, rng.randint(1, min(S, 8)), S]), S, H_kv * g, H_kv, rng.choice([8, 16, 32, 64])
    for label, (T, S, H, H_kv, D) in t.cases(visible, hidden, n=4):
        with t.case(f"{label}: T={T}, S={S}, heads={H}, kv_heads={H_kv}, head_dim={D}"):
            q, k, v = _qkv(t, T, S, H, H_kv, D)
            expected = sdpa_reference(q, k, v)
            t.expect(t.call("decode_attention", q, k, v), expected, "attention output",
                     mistakes=attention_mistakes(q, k, v))
    with t.case("bf16 q, k, v: T=2, S=16, heads=4, kv_heads=1, head_dim=32, keys with a large common part"):
        q, k, v = _attention.bf16_qkv(2)
        exact = sdpa_reference(q.float(), k.float(), v.float())
        t.expect(t.call("decode_attention", q, k, v), exact.bfloat16(), "attention output", mistakes={
            "computes the scores and the softmax in bf16: upcast q, k and v to float32 first (bf16 keeps "
            "2-3 significant digits: a score near 100 is off by up to 0.25), and cast the output back":
                attention_variant(q, k, v),
            "returns float32: cast the output back to q's dtype": exact})


# -- 2.5 the cache ----------------------------------------------------------------------------

def _kv(t, n, H_kv, D):
    return torch.randn(n, H_kv, D, generator=t.gen), torch.randn(n, H_kv, D, generator=t.gen)


def new_cache(t, layers, max_tokens, H_kv, D, dtype=torch.float32):
    ref = t.ref.KVCache(layers, max_tokens, H_kv, D, dtype)
    return t.call("KVCache", layers, max_tokens, H_kv, D, dtype), ref


def append_both(t, cache, ref, layer, k, v):
    ref.append(layer, k, v)
    t.call_fn(cache.append, layer, k, v, what="KVCache.append")


def expect_read(t, cache, ref, layer, max_tokens, last=None):
    expected = ref.read(layer)
    got = t.call_fn(cache.read, layer, what="KVCache.read")
    t.expect_true(isinstance(got, (tuple, list)) and len(got) == 2,
                  f"KVCache.read({layer}) should return a (K, V) pair, got {type(got).__name__}")
    n = expected[0].shape[0]
    if isinstance(got[0], torch.Tensor) and got[0].ndim == 3 and got[0].shape[0] == max_tokens != n:
        t.fail(f"KVCache.read({layer}): K has {max_tokens} rows but only {n} tokens were appended.",
               "reads past the filled length (returns the whole preallocated buffer); slice it to length(layer)")
    mistakes = {}
    if last is not None and last[0].shape[0] != n:
        mistakes["overwrites the cache instead of appending to it (read should return every token "
                 "so far, in order)"] = tuple(x.to(expected[0].dtype) for x in last)
    t.expect(tuple(got), tuple(expected), f"KVCache.read({layer})", mistakes=mistakes)


@check(points=3, section="2.5")
def kv_cache(t):
    """append() adds after what is there; read() returns exactly the filled tokens, per layer."""
    with t.case("prefill 5 tokens into layer 0 of 2, read both layers"):
        cache, ref = new_cache(t, 2, 16, 2, 8)
        k, v = _kv(t, 5, 2, 8)
        append_both(t, cache, ref, 0, k, v)
        expect_read(t, cache, ref, 0, 16)
        expect_read(t, cache, ref, 1, 16)
    with t.case("prefill 4 tokens, then three 1-token decode steps, on every layer"):
        cache, ref = new_cache(t, 3, 12, 2, 4)
        last = {}
        for n in (4, 1, 1, 1):
            for layer in range(3):
                last[layer] = _kv(t, n, 2, 4)
                append_both(t, cache, ref, layer, *last[layer])
        for layer in range(3):
            expect_read(t, cache, ref, layer, 12, last=last[layer])
    with t.case("length() per layer, halfway through a forward pass"):
        cache, ref = new_cache(t, 3, 10, 1, 4)
        for layer, n in [(0, 3), (1, 3), (2, 3), (0, 2)]:
            append_both(t, cache, ref, layer, *_kv(t, n, 1, 4))
        got = [t.call_fn(cache.length, layer, what="KVCache.length") for layer in range(3)]
        t.expect(got, [ref.length(layer) for layer in range(3)], "[length(0), length(1), length(2)]")
    with t.case("filling to exactly max_tokens fits; one token more raises ValueError"):
        cache, ref = new_cache(t, 1, 6, 2, 4)
        append_both(t, cache, ref, 0, *_kv(t, 4, 2, 4))
        _, raised = t.attempt(append_both, t, cache, ref, 0, *_kv(t, 2, 2, 4))
        if raised:
            t.fail(f"append of 2 tokens after 4, with max_tokens=6, raised {raised.type_name}.", "refuses to fill "
                   "the cache to exactly max_tokens (an off-by-one: 4 + 2 <= 6 fits)", end="")
        expect_read(t, cache, ref, 0, 6)
        t.expect_raises(ValueError, cache.append, 0, *_kv(t, 1, 2, 4), what="KVCache.append",
                        why="the cache is full (6 of max_tokens=6): one more token does not fit; silently dropping "
                            "or wrapping would corrupt attention")
    with t.case("a float16 cache stores float16"):
        cache, ref = new_cache(t, 2, 8, 2, 4, torch.float16)
        for layer in range(2):
            append_both(t, cache, ref, layer, *_kv(t, 3, 2, 4))
        expect_read(t, cache, ref, 1, 8)
    def hidden(rng):
        chunks = [rng.randint(1, 12)] + [rng.choice([1, 1, 1, 2, 3]) for _ in range(rng.randint(1, 5))]
        return rng.randint(1, 4), rng.randint(1, 4), rng.choice([4, 8, 16, 32]), chunks, sum(chunks) + rng.randint(0, 8)
    for i, (layers, H_kv, D, chunks, max_tokens) in enumerate(t.cases(hidden=hidden, n=2)):
        with t.case(f"hidden {i + 1}: {layers} layers, kv_heads={H_kv}, head_dim={D}, max_tokens={max_tokens}, "
                    f"appends of {chunks} tokens"):
            cache, ref = new_cache(t, layers, max_tokens, H_kv, D)
            last = {}
            for n in chunks:
                for layer in range(layers):
                    last[layer] = _kv(t, n, H_kv, D)
                    append_both(t, cache, ref, layer, *last[layer])
            for layer in range(layers):
                expect_read(t, cache, ref, layer, max_tokens, last=last[layer])
            got = [t.call_fn(cache.length, layer, what="KVCache.length") for layer in range(layers)]
            t.expect(got, [ref.length(layer) for layer in range(layers)], "lengths per layer")


@check(points=2, section="2.5")
def kv_cache_attend(t):
    """Step by step, attend() gives what full causal attention over the whole sequence gives."""
    visible = [("prefill with append(), then steps with attend()", (2, 4, 2, 8, False, [5, 1, 1, 1, 2])),
               ("prefill with attend(), then decode steps", (2, 4, 1, 8, True, [6, 1, 1]))]

    def hidden(rng):
        H_kv, g = rng.randint(1, 3), rng.choice([1, 2, 4, 8])
        steps = [rng.randint(1, 10)] + [rng.choice([1, 1, 2, 3]) for _ in range(rng.randint(2, 4))]
        return rng.randint(1, 3), H_kv * g, H_kv, rng.choice([8, 16, 32]), rng.random() < 0.5, steps
    for label, (layers, H, H_kv, D, attend_prefill, steps) in t.cases(visible, hidden, n=2):
        with t.case(f"{label}: steps of {steps} tokens (the first with {'attend' if attend_prefill else 'append'}()), "
                    f"layers={layers}, heads={H}, kv_heads={H_kv}, head_dim={D}"):
            cache, _ = new_cache(t, layers, sum(steps) + 2, H_kv, D)
            hist = [(torch.empty(0, H_kv, D), torch.empty(0, H_kv, D)) for _ in range(layers)]
            for i, n in enumerate(steps):
                for layer in range(layers):
                    q = torch.randn(n, H, D, generator=t.gen)
                    k, v = _kv(t, n, H_kv, D)
                    old_k, old_v = hist[layer]
                    hist[layer] = (torch.cat([old_k, k]), torch.cat([old_v, v]))
                    if i == 0 and not attend_prefill:
                        t.call_fn(cache.append, layer, k, v, what="KVCache.append")
                        continue
                    expected = sdpa_reference(q, *hist[layer])
                    wrong = {"attends only over this step's new tokens, not the whole cache":
                             t.ref.decode_attention(q, k, v)}
                    if old_k.shape[0] >= n:
                        wrong["attends before appending this step's k, v (a token must see its own key)"] = \
                            t.ref.decode_attention(q, old_k, old_v)
                    got = t.call_fn(cache.attend, layer, q, k, v, what="KVCache.attend")
                    t.expect(got, expected, f"step {i} ({n} new tokens), layer {layer}: attend() output",
                             mistakes=wrong)
