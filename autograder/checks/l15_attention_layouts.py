"""Checks of lesson 15: cache bytes per layout, a GQA decode kernel, MLA with absorbed projections.

Wrong answers are named by computing the usual wrong versions here on the same inputs (the
`_*_variant` functions). What only the learner's process can observe (which tensors the absorbed MLA
builds, how fast a kernel runs on the GPU) comes back from harness functions (autograder/harnesses/
l15_attention_layouts.py), run there by `t.run`, and is judged here.
"""
from __future__ import annotations

import math

import torch

from autograder.checks._configs import shape
from autograder.compare import compare
from autograder.core import LearnerRaised, check
from autograder.harnesses.l15_attention_layouts import gqa_timing_inputs, time_gqa, watch_shapes
from autograder.harnesses.timing import seconds_per_call
from autograder.mistakes import looks_like
from autograder.reference import answer_code

# ---------------------------------------------------------------- what a check depends on


# ---------------------------------------------------------------- 1. bytes per token


def _rand_mla_config(rng) -> dict:
    heads = rng.choice([16, 32, 64, 128])
    rope = rng.choice([32, 64])
    cfg = {"num_hidden_layers": rng.randint(2, 96), "num_attention_heads": heads,
           "num_key_value_heads": heads, "hidden_size": heads * rng.choice([32, 56, 64]),
           "kv_lora_rank": rng.choice([128, 256, 512]), "qk_rope_head_dim": rope,
           "qk_nope_head_dim": rng.choice([64, 128]), "v_head_dim": rng.choice([64, 128]),
           "q_lora_rank": rng.choice([None, 768, 1536])}
    if rng.random() < 0.5:
        cfg["head_dim"] = rope  # what transformers' DeepseekV2Config writes out: another trap
    return cfg


def _rand_dense_config(rng, kind: str) -> dict:
    heads = rng.choice([8, 16, 24, 32, 40, 64])
    d = rng.choice([64, 80, 96, 128])
    cfg = {"num_hidden_layers": rng.randint(2, 96), "num_attention_heads": heads,
           "hidden_size": heads * d}
    if kind == "MHA, num_key_value_heads missing":
        return cfg
    if kind == "MQA":
        cfg["num_key_value_heads"] = 1
    elif kind == "MHA, num_key_value_heads null":
        cfg["num_key_value_heads"] = None
    else:
        cfg["num_key_value_heads"] = rng.choice([k for k in (2, 4, 8) if heads % k == 0 and k < heads])
    if kind.endswith("explicit head_dim"):
        # Not d, d/2 or 2d: those would make a wrong answer look like another mistake.
        cfg["head_dim"] = rng.choice([x for x in (64, 128, 192, 256) if x not in (d, 2 * d, d // 2)])
    return cfg


@answer_code
def _kv_mistakes(cfg: dict, b: int, gqa: int) -> dict:
    """The usual wrong MLA branches; `gqa` is the given helper's literal GQA reading of `cfg`. The
    MHA/GQA/MQA bytes come from that helper, so a dense config has no mistake of its own to name."""
    if not cfg.get("kv_lora_rank"):
        return {}
    s = shape(cfg)  # absent or null fields: their defaults
    L, heads, hidden, kv = s.layers, s.heads, cfg["hidden_size"], s.kv_heads
    r, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    return {
        "uses the GQA formula on an MLA model (gqa_kv_bytes_per_token: 2 x layers x num_key_value_heads x "
        "head_dim); MLA caches one latent per layer, detect it by a non-null kv_lora_rank": gqa,
        "uses the GQA formula on an MLA model (2 x layers x num_key_value_heads x "
        "hidden_size/heads); MLA caches one latent per layer": 2 * L * kv * (hidden // heads) * b,
        "uses the GQA formula on an MLA model: it counts decompressed per-head K "
        "(qk_nope + qk_rope) and V (v_head_dim), which MLA never stores":
            L * kv * (cfg["qk_nope_head_dim"] + rope + cfg["v_head_dim"]) * b,
        "counts K and V for the MLA latent (the latent is shared, stored once)": 2 * L * (r + rope) * b,
        "counts K and V for the MLA latent (the latent is shared, stored once; "
        "only the small RoPE key is extra)": L * (2 * r + rope) * b,
        "forgets the decoupled RoPE key (qk_rope_head_dim values per layer)": L * r * b,
        "stores the latent once per head (it is one vector per layer, shared by all heads)":
            L * heads * (r + rope) * b,
        "stores the RoPE key once per head (the decoupled key is one vector per layer, shared by all heads)":
            L * (r + heads * rope) * b,
    }


DENSE_KINDS = ["MHA, num_key_value_heads missing", "MHA, num_key_value_heads null", "MQA",
               "GQA, explicit head_dim", "GQA"]
# DeepSeek-V2-Lite's attention fields: MLA with q_lora_rank null (its queries are not compressed), so
# testing q_lora_rank instead of kv_lora_rank misses it.
MLA_NO_Q_LORA = {"num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
                 "hidden_size": 2048, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                 "qk_rope_head_dim": 64, "v_head_dim": 128}


@check(points=3, section="1.1", timeout=10)
def kv_bytes_per_token(t):
    """Cache bytes per token: the MLA latent and RoPE key when kv_lora_rank is set, else the given GQA helper."""
    R = t.ref
    # What transformers writes out for a dense model: the fields present, set to null.
    nulls = {"num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": None, "hidden_size": 3072,
             "head_dim": None, "kv_lora_rank": None, "qk_rope_head_dim": None}
    visible = [("Llama-3-70B, bf16", (R.LLAMA_3_70B, 2)), ("DeepSeek-V3, bf16", (R.DEEPSEEK_V3, 2)),
               ("DeepSeek-V2, bf16", (R.DEEPSEEK_V2, 2)), ("Mistral-7B, fp8", (R.MISTRAL_7B, 1)),
               ("MLA with q_lora_rank null (DeepSeek-V2-Lite's shape), fp8", (MLA_NO_Q_LORA, 1)),
               ("GQA whose head_dim is not hidden_size / heads", ({"num_hidden_layers": 40,
                "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 5120, "head_dim": 128}, 2)),
               ("MHA with num_key_value_heads, head_dim and kv_lora_rank present but null", (nulls, 2))]
    # Every kind on every seed: a kind drawn only sometimes lets its mistake pass on the other seeds.
    hidden = [(_rand_dense_config(t.rng, kind), t.rng.choice([1, 2, 4]), kind) for kind in DENSE_KINDS]
    hidden += [(_rand_mla_config(t.rng), t.rng.choice([1, 2]), "MLA") for _ in range(2)]
    for label, (cfg, b, *kind) in t.cases(visible=visible, hidden=hidden):
        with t.case(f"{label}{': ' + kind[0] if kind else ''} ({b} B/element)"):
            expected = R.kv_bytes_per_token(cfg, b)
            got = _call_on_nulls(t, "kv_bytes_per_token", cfg, b)
            gqa = R.gqa_kv_bytes_per_token(cfg, b) if cfg.get("kv_lora_rank") else None
            t.expect(got, expected, f"bytes per token for {_cfg_repr(cfg)}", mistakes=_kv_mistakes(cfg, b, gqa),
                     count=True)


def _call_on_nulls(t, name: str, cfg: dict, *args):
    """t.call(name, cfg, *args); a TypeError on a config with null fields is named for what it usually is."""
    try:
        return t.call(name, cfg, *args)
    except LearnerRaised as e:
        nulls = [k for k in ("num_key_value_heads", "head_dim", "kv_lora_rank", "qk_rope_head_dim")
                 if k in cfg and cfg[k] is None]
        if not nulls or not e.is_a(TypeError) or e.not_implemented:
            raise
        t.fail(f"{name}() raised on a config whose {', '.join(nulls)} are present but null:\n{e.tb_text}\n"
               + looks_like("reads a null field as a value: config.get(key, default) gives None when the key is there "
                            "with null, and 'kv_lora_rank' in config is true for it; a null kv_lora_rank means the "
                            "model is not MLA: test config.get(\"kv_lora_rank\")", end=""))


def _cfg_repr(cfg: dict) -> str:
    keys = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
            "head_dim", "kv_lora_rank", "qk_rope_head_dim"]
    return "{" + ", ".join(f"{k}: {cfg[k]}" for k in keys if k in cfg) + "}"


@answer_code
def _capacity_mistakes(per: int, params, wb, gpus, gpu_bytes, copies, default: bool) -> dict:
    """The usual wrong capacities; `per`: the cache bytes per token (the reference's kv_bytes_per_token)."""
    free = gpus * gpu_bytes - params * wb
    out = {"returns a negative count when the weights do not fit (return 0)": int(free // (per * copies)),
           "does not subtract the weights": int(gpus * gpu_bytes // (per * copies)),
           "ignores kv_copies (a replicated cache takes its bytes once per copy)": max(0, int(free // per)),
           "subtracts the whole model from every GPU (the weights are split across them)":
               max(0, int(gpus * (gpu_bytes - params * wb) // (per * copies))),
           "rounds to the nearest token (whole tokens only: round down)": max(0, round(free / (per * copies))),
           "counts one GPU's memory, not num_gpus x gpu_bytes (the cache spreads over every GPU)":
               max(0, int((gpu_bytes - params * wb) // (per * copies)))}
    if default:
        out["stores a copy per GPU when kv_copies is not given (its default is 1: each token once)"] = \
            max(0, int(free // (per * gpus)))
    return out


@check(points=2, section="1.2", timeout=10)
def kv_capacity_tokens(t):
    """Tokens of cache that fit after the weights, with the cache stored once or per GPU (default: once)."""
    R = t.ref
    visible = [("Llama-3-70B bf16 on 8 x 141 GB", (R.LLAMA_3_70B, 70.55e9, 2, 2, 8, 141e9, 1)),
               ("Llama-3-70B bf16 on 4 x 80 GB, kv_copies left at its default",
                (R.LLAMA_3_70B, 70.55e9, 2, 2, 4, 80e9, None)),
               ("DeepSeek-V3 fp8 weights, latent on every GPU (plain TP)", (R.DEEPSEEK_V3, 671e9, 1, 2, 8, 141e9, 8)),
               ("DeepSeek-V3 fp8 weights, each latent stored once", (R.DEEPSEEK_V3, 671e9, 1, 2, 8, 141e9, 1)),
               ("DeepSeek-V3 bf16 weights on 8 x 141 GB (they do not fit)", (R.DEEPSEEK_V3, 671e9, 2, 2, 8, 141e9, 1))]

    def hidden(rng):
        cfg = rng.choice([R.LLAMA_3_8B, R.MISTRAL_7B, R.LLAMA_3_70B, R.DEEPSEEK_V2])
        gpus = rng.choice([1, 2, 4, 8])
        params = R.param_count(cfg) * rng.uniform(0.9, 1.1)
        return (cfg, params, rng.choice([1, 2]), rng.choice([1, 2]), gpus, rng.choice([40e9, 80e9, 141e9]),
                rng.choice([1, gpus]))
    for label, (cfg, params, wb, kvb, gpus, gpu_bytes, copies) in t.cases(visible=visible, hidden=hidden, n=3):
        args = (cfg, params, wb, kvb, gpus, gpu_bytes) + (() if copies is None else (copies,))
        with t.case(f"{label}: {cfg['name']}, {params / 1e9:.4g}B params x {wb} B, "
                    f"{gpus} x {gpu_bytes / 1e9:g} GB, kv_copies={copies or '(default)'}"):
            expected = R.kv_capacity_tokens(*args)
            got = t.call("kv_capacity_tokens", *args)
            per = R.kv_bytes_per_token(cfg, kvb)
            if compare(got, expected) is not None:  # the learner's kv_bytes_per_token, if wrong here, is to blame
                t.blame_upstream("kv_capacity_tokens", "kv_bytes_per_token", [((cfg, kvb), per)], rtol=None,
                                 shown=f"{cfg['name']}, {kvb}")
            t.expect(got, expected, "tokens", mistakes=_capacity_mistakes(per, params, wb, gpus, gpu_bytes,
                                                                          copies or 1, default=copies is None),
                     count=True)


# ---------------------------------------------------------------- 2. GQA decode


@answer_code
def _gqa_variant(q, k_cache, v_cache, seq_lens, kv_map="div", scale=None, lens=None, weights=None,
                 dtype=torch.float32):
    """A torch GQA decode with one thing changed, to name what a wrong answer did: `kv_map` "mod" (head h
    reads KV head h % num_kv_heads), `scale`, `lens` (positions attended), `weights` [B, L] (how many
    times each position is counted: 0, 1 or 2), `dtype` (what the scores and softmax are computed in)."""
    B, H, D = q.shape
    _, L, H_kv, _ = k_cache.shape
    idx = torch.arange(H) // (H // H_kv) if kv_map == "div" else torch.arange(H) % H_kv
    k = k_cache.to(dtype)[:, :, idx.to(q.device)]
    v = v_cache.to(dtype)[:, :, idx.to(q.device)]
    s = torch.einsum("bhd,blhd->bhl", q.to(dtype), k) * (1 / math.sqrt(D) if scale is None else scale)
    lens = seq_lens if lens is None else lens
    s = s.masked_fill((torch.arange(L, device=q.device)[None, :] >= lens.to(q.device)[:, None])[:, None, :],
                      float("-inf"))
    if weights is not None:
        s = s + weights.to(s.device, s.dtype).log()[:, None, :]
    return torch.einsum("bhl,blhd->bhd", s.softmax(-1), v).to(q.dtype)


@answer_code
def _padded_block_variant(q, k_cache, v_cache, seq_lens, block=16):
    """Scores of the last block's padding (K = V = 0 there) left in the softmax."""
    B, _, _ = q.shape
    L = k_cache.shape[1]
    padded_len = ((int(seq_lens.max()) + block - 1) // block) * block
    k = torch.zeros(B, max(L, padded_len), *k_cache.shape[2:], dtype=k_cache.dtype, device=k_cache.device)
    v = torch.zeros_like(k)
    for b in range(B):
        n = int(seq_lens[b])
        k[b, :n], v[b, :n] = k_cache[b, :n], v_cache[b, :n]
    padded = ((seq_lens + block - 1) // block) * block
    return _gqa_variant(q, k, v, seq_lens, lens=padded)


@answer_code
def _gqa_mistakes(q, k, v, lens, block_n: int | None = None) -> dict:
    """The usual wrong answers. block_n: the kernel's block (None: a torch implementation), for the
    mistakes only a kernel that walks the positions in blocks makes."""
    D, L = q.shape[-1], k.shape[1]
    n = lens.long()
    out = {
        "maps query head h to KV head h % num_kv_heads instead of h // group (heads 0..group-1 "
        "share KV head 0)": _gqa_variant(q, k, v, lens, kv_map="mod"),
        "does not scale scores by 1/sqrt(head_dim)": _gqa_variant(q, k, v, lens, scale=1.0),
        "scales scores by 1/head_dim instead of 1/sqrt(head_dim)": _gqa_variant(q, k, v, lens, scale=1.0 / D),
        "attends to positions past the sequence length (mask every row >= seq_lens[b])":
            _gqa_variant(q, k, v, lens, lens=torch.full_like(lens, L)),
        "drops the newest token: seq_lens already counts it (attend to rows < seq_lens[b])":
            _gqa_variant(q, k, v, lens, lens=n - 1),
    }
    if block_n is None:
        out["attends to one row too many (rows < seq_lens[b], not <= seq_lens[b])"] = \
            _gqa_variant(q, k, v, lens, lens=torch.clamp(n + 1, max=L))
    else:
        out["attends to positions past the sequence length (the last block's padding stays in the "
            "softmax: set its scores to -inf)"] = _padded_block_variant(q, k, v, lens, block_n)
    if block_n is not None and block_n > 16:
        pos = torch.arange(L)[None, :].expand(len(lens), -1)
        out["ignores BLOCK_N: it reads 16 positions per step of BLOCK_N (use tl.arange(0, BLOCK_N))"] = \
            _gqa_variant(q, k, v, lens, weights=(pos % block_n < 16).float())
        out["steps by 16 but reads BLOCK_N positions: positions past the first 16 are counted more than "
            "once (step by BLOCK_N)"] = \
            _gqa_variant(q, k, v, lens, weights=torch.clamp(pos // 16 + 1, max=block_n // 16).float())
    if q.dtype == torch.bfloat16:
        out["computes the scores and softmax in bf16: upcast q, K and V to float32 first (bf16 keeps 8 bits "
            "of a score, and exp turns that error into percents)"] = _gqa_variant(q, k, v, lens, dtype=q.dtype)
    return out


def _gqa_case(t, B, H, H_kv, D, L, lens, dtype=torch.float32, q_scale=1.0):
    g = t.gen
    q = torch.randn(B, H, D, generator=g) * q_scale
    k = torch.randn(B, L, H_kv, D, generator=g)
    v = torch.randn(B, L, H_kv, D, generator=g)
    lens = torch.tensor(lens, dtype=torch.int32)
    return [x.to(t.device, dtype) for x in (q, k, v)] + [lens.to(t.device)]


def _gqa_configs(t, bf16: bool = False) -> list:
    """(label, (B, H, H_kv, D, L, lens, options)): visible ones (bf16: one with bf16 inputs and a sharp
    softmax), then group sizes 1, 2, 4, 8 hidden (each on every seed)."""
    visible = [("visible: 2 seqs, 8 heads / 2 KV heads, d=16", (2, 8, 2, 16, 40, [37, 1], {})),
               ("visible: 3 seqs, MQA 4 heads / 1 KV head, d=32", (3, 4, 1, 32, 24, [24, 16, 5], {}))]
    if bf16:
        visible.append(("visible: bf16 inputs, sharp scores (queries x6), 3 seqs up to 130 tokens",
                        (3, 8, 2, 64, 130, [130, 57, 100], {"dtype": torch.bfloat16, "q_scale": 6.0})))
    hidden = []
    for group in (1, 2, 4, 8):
        H_kv = t.rng.choice([1, 2, 3]) if group > 1 else t.rng.choice([2, 3, 4])
        D = t.rng.choice([16, 32, 64])
        B = t.rng.choice([1, 2, 3])
        L = t.rng.randint(17, 48)
        lens = [t.rng.choice([1, 16, 17, t.rng.randint(2, L)])] + [t.rng.randint(1, L) for _ in range(B - 1)]
        t.rng.shuffle(lens)
        hidden.append((B, group * H_kv, H_kv, D, L, lens, {}))
    return [(label if label.startswith("visible") else
             f"{label}: group {H // H_kv}, {B} seqs, {H} heads / {H_kv} KV heads, d={D}, lengths {lens} of max {L}",
             (B, H, H_kv, D, L, lens, opts))
            for label, (B, H, H_kv, D, L, lens, opts) in t.cases(visible=visible, hidden=hidden)]


def _expect_gqa(t, name: str, args: list, kernel_block: int | None, tol: dict | None = None, **call_kw):
    """Call the learner's `name` on args (and call_kw), expect the reference, name the usual mistakes;
    kernel_block: the BLOCK_N the kernel runs with (None: a torch implementation)."""
    expected = t.ref.gqa_decode_torch(*args)
    got = t.call(name, *args, **call_kw)
    hint = ("Compute the scores, softmax and weighted sum in float32, then cast the output to q's dtype."
            if args[0].dtype == torch.bfloat16 else "")
    t.expect(got, expected, "attention output", mistakes=_gqa_mistakes(*args, block_n=kernel_block), hint=hint,
             **(tol or {}))


@check(points=2, section="2.1", timeout=15)
def gqa_decode_torch(t):
    """The torch GQA decode: head mapping, scale, ragged lengths, and a float32 softmax for bf16 inputs."""
    for label, (*cfg, opts) in _gqa_configs(t, bf16=True):
        with t.case(label):
            _expect_gqa(t, "gqa_decode_torch", _gqa_case(t, *cfg, **opts), kernel_block=None)


def _time_reference(lens: list[int], seed: int, reps: int = 20) -> float:
    """Seconds per call of a torch GQA decode (float32 scores, K/V repeated per query head: the lesson's reference),
    here in the grader, on the inputs the learner's kernel was timed on (harness time_gqa)."""
    args = gqa_timing_inputs(lens, seed)
    # As written, not through a release's store: a timing is no question to replay (a student's copy, which has
    # not the reference's code, reports this case as graded by the instructor).
    reference = _gqa_variant.__wrapped__
    seconds = seconds_per_call(lambda: reference(*args), reps)
    args = None  # the inputs' 0.5 GB back to the device before the check goes on
    torch.cuda.empty_cache()
    return seconds


@check(points=4, section="2.2", timeout=60, cost=0.7, requires_triton=True)
def gqa_decode_triton(t):
    """The Triton GQA decode kernel against the torch reference (fp32, block_n 16 and 32; bf16 and timing on CUDA)."""
    # tl.dot on fp32 uses TF32 on NVIDIA GPUs (10-bit mantissa): loosen fp32 there only.
    tol = {"rtol": 5e-3, "atol": 5e-3} if t.cuda else {}
    for label, (*cfg, opts) in _gqa_configs(t):
        with t.case(label):
            _expect_gqa(t, "gqa_decode_triton", _gqa_case(t, *cfg, **opts), kernel_block=16, tol=tol)
    with t.case("visible: block_n=32 (the launcher's BLOCK_N is not always 16), 2 seqs of 70 and 40 rows"):
        _expect_gqa(t, "gqa_decode_triton", _gqa_case(t, 2, 4, 2, 16, 70, [70, 40]), kernel_block=32, tol=tol,
                    block_n=32)
    with t.case("large scores (beyond 88.7, where exp overflows float32)"):
        q, k, v, lens_t = _gqa_case(t, 2, 4, 2, 16, 33, [33, 20], q_scale=60.0)
        expected = t.ref.gqa_decode_torch(q, k, v, lens_t)
        got = t.call("gqa_decode_triton", q, k, v, lens_t)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.isfinite(got).all():
            t.fail("your output has inf/NaN where the answer is finite.", "skips the running-max subtraction, so exp "
                   "overflows: use exp(s - m_new) and rescale by exp(m - m_new)", end="")
        # TF32 rounding of scores near 150 moves the softmax by a few percent on a GPU.
        big_tol = {"rtol": 5e-2, "atol": 5e-2} if t.cuda else {}
        t.expect(got, expected, "attention output", mistakes=_gqa_mistakes(q, k, v, lens_t, block_n=16), **big_tol)
    with t.case("bf16 inputs", requires_cuda=True) as on:
        if on:
            args = _gqa_case(t, 4, 32, 8, 128, 300, [300, 1, 77, 250], dtype=torch.bfloat16, q_scale=6.0)
            _expect_gqa(t, "gqa_decode_triton", args, kernel_block=16)
    with t.case("speed: not slower than 1.5x the torch reference (bf16, 32 seqs x 4096)",
                requires_cuda=True) as on:
        if on:
            lens, seed = [t.rng.randint(2048, 4096) for _ in range(32)], t.rng.randrange(2**31)
            got = t.run(time_gqa, t.learner("gqa_decode_triton"), lens, seed, what="gqa_decode_triton, timed,")
            mine, ref = got["mine"], _time_reference(lens, seed)
            if not (type(mine) is float and type(ref) is float and mine > 0 and ref > 0):
                t.fail(f"the timing of your kernel came back as {mine!r} s per call: it must be a positive time")
            t.expect_true(mine <= 1.5 * ref, f"your kernel takes {mine * 1e3:.3f} ms per call, the torch "
                          f"reference {ref * 1e3:.3f} ms: load each K/V block once for the whole group")


# ---------------------------------------------------------------- 3. MLA


def _rand_mla_cfg(t) -> dict:
    rng = t.rng
    return {"hidden_size": rng.choice([32, 48, 64]), "num_attention_heads": rng.choice([2, 3, 4, 6]),
            "q_lora_rank": rng.choice([None, 16, 24]), "kv_lora_rank": rng.choice([16, 24, 40]),
            "qk_nope_head_dim": rng.choice([8, 12, 16]), "qk_rope_head_dim": rng.choice([4, 8]),
            "v_head_dim": rng.choice([8, 20]), "rope_theta": rng.choice([10000.0, 50000.0])}


def _mla_repr(cfg: dict) -> str:
    return (f"hidden={cfg['hidden_size']}, heads={cfg['num_attention_heads']}, "
            f"q_lora_rank={cfg['q_lora_rank']}, kv_lora_rank={cfg['kv_lora_rank']}, "
            f"nope={cfg['qk_nope_head_dim']}, rope={cfg['qk_rope_head_dim']}, v={cfg['v_head_dim']}, "
            f"theta={cfg['rope_theta']:g}")


def _seeded_mla_weights(R, cfg: dict, seed: int) -> dict:
    return R.random_mla_weights(cfg, torch.Generator().manual_seed(seed))


def _mla_weights(t, cfg: dict) -> dict:
    """The reference's random_mla_weights, from a seed drawn here: a generator cannot be part of a
    question a student's copy replays (`t.reference`)."""
    return t.reference(_seeded_mla_weights, cfg, t.rng.randrange(2**31))


def _mla_setup(t, cfg, S, T, start_pos=0):
    """Weights, all S tokens' hidden states, the cache (from the reference), the newest T tokens."""
    w = _mla_weights(t, cfg)
    x_all = torch.randn(S, cfg["hidden_size"], generator=t.gen)
    pos_all = torch.arange(start_pos, start_pos + S)
    c_kv, k_pe = t.ref.mla_cache_entry(w, cfg, x_all, pos_all)
    if start_pos:  # the cache also holds earlier tokens 0 .. start_pos-1
        x_old = torch.randn(start_pos, cfg["hidden_size"], generator=t.gen)
        c_old, k_old = t.ref.mla_cache_entry(w, cfg, x_old, torch.arange(start_pos))
        c_kv, k_pe = torch.cat([c_old, c_kv]), torch.cat([k_old, k_pe])
    return w, x_all, pos_all, c_kv, k_pe, x_all[S - T:], pos_all[S - T:]


@answer_code
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The lesson's given rms_norm (its code as the stub gives it), for the mistakes' values."""
    xf = x.float()
    return (weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


@answer_code
def _rope_interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """The lesson's given rope_interleaved (its code as the stub gives it), for the mistakes' values."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = positions.to(x.device).float()[:, None] * inv_freq[None, :]
    ang = ang.reshape(ang.shape[0], *([1] * (x.dim() - 2)), d // 2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    x0, x1 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)


@answer_code
def _rope_half_split(x, positions, theta):
    """Llama-style RoPE: pairs (x[i], x[i + d/2]) instead of adjacent pairs."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = positions.float()[:, None] * inv[None, :]
    ang = ang.reshape(ang.shape[0], *([1] * (x.dim() - 2)), d // 2)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


ROTATE_HALF = ("applies Llama's half-split RoPE (rotate_half: x[i] with x[i + d/2]) instead of "
               "DeepSeek's adjacent pairs (x[2i], x[2i+1]); use rope_interleaved")
THETA_10K = "rotates with rope_theta 10000 instead of the config's rope_theta"


@answer_code
def _query_mistakes(w, cfg, x, pos, eps: float) -> dict:
    """The usual wrong queries; `eps`: the lesson's NORM_EPS."""
    H, nope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"]

    def raw(norm=True):
        if cfg.get("q_lora_rank"):
            a = x @ w["q_a_proj.weight"].T
            a = _rms_norm(a, w["q_a_layernorm.weight"], eps) if norm else a
            q = a @ w["q_b_proj.weight"].T
        else:
            q = x @ w["q_proj.weight"].T
        q = q.view(x.shape[0], H, -1)
        return q[..., :nope], q[..., nope:]

    qn, qp = raw()
    out = {ROTATE_HALF: (qn, _rope_half_split(qp, pos, cfg["rope_theta"])),
           "forgets RoPE on q_pe": (qn, qp), THETA_10K: (qn, _rope_interleaved(qp, pos, 10000.0))}
    if cfg.get("q_lora_rank"):
        qn2, qp2 = raw(norm=False)
        out["skips q_a_layernorm between q_a_proj and q_b_proj"] = (qn2, _rope_interleaved(qp2, pos, cfg["rope_theta"]))
    return out


def _mla_cfgs(t) -> list:
    """Visible: with and without q_lora; the second with rope_theta 50000, so that a hard-coded 10000 shows."""
    tiny = dict(t.ref.MLA_TINY)
    return t.cases(visible=[("visible: MLA_TINY (q_lora_rank 24)", tiny),
                            ("visible: MLA_TINY without q_lora, rope_theta 50000",
                             {**tiny, "q_lora_rank": None, "rope_theta": 50000.0})],
                   hidden=[_rand_mla_cfg(t), _rand_mla_cfg(t)])


@check(points=2, section="3.1", timeout=10)
def mla_query(t):
    """The MLA query: optional q_lora path, split into nope and RoPE parts, interleaved RoPE."""
    R = t.ref
    for label, cfg in _mla_cfgs(t):
        with t.case(f"{label}: {_mla_repr(cfg)}"):
            w = _mla_weights(t, cfg)
            T = t.rng.randint(2, 6)
            x = torch.randn(T, cfg["hidden_size"], generator=t.gen)
            pos = torch.arange(T) + t.rng.randint(0, 50)
            expected = R.mla_query(w, cfg, x, pos)
            got = t.call("mla_query", w, cfg, x, pos)
            t.expect(got, expected, "(q_nope, q_pe)", mistakes=_query_mistakes(w, cfg, x, pos, R.NORM_EPS))


@check(points=2, section="3.1", timeout=10)
def mla_cache_entry(t):
    """What MLA caches: the normalised latent and the rotated shared RoPE key."""
    R = t.ref
    for label, cfg in _mla_cfgs(t):
        with t.case(f"{label}: {_mla_repr(cfg)}"):
            w = _mla_weights(t, cfg)
            T = t.rng.randint(2, 8)
            x = torch.randn(T, cfg["hidden_size"], generator=t.gen)
            pos = torch.arange(T) + t.rng.randint(0, 50)
            expected = R.mla_cache_entry(w, cfg, x, pos)
            got = t.call("mla_cache_entry", w, cfg, x, pos)
            t.expect(got, expected, "(c_kv, k_pe)",
                     mistakes=_cache_entry_mistakes(w, cfg, x, pos, expected[1], R.NORM_EPS))


@answer_code
def _cache_entry_mistakes(w, cfg, x, pos, k_pe, eps: float) -> dict:
    """The usual wrong cache entries; `k_pe`: the reference's RoPE key, `eps`: the lesson's NORM_EPS."""
    r, theta = cfg["kv_lora_rank"], cfg["rope_theta"]
    a = x @ w["kv_a_proj_with_mqa.weight"].T
    c = _rms_norm(a[:, :r], w["kv_a_layernorm.weight"], eps)
    rope = cfg["qk_rope_head_dim"]
    return {
        ROTATE_HALF: (c, _rope_half_split(a[:, r:], pos, theta)),
        THETA_10K: (c, _rope_interleaved(a[:, r:], pos, 10000.0)),
        "forgets RoPE on k_pe (it is cached already rotated)": (c, a[:, r:]),
        "skips kv_a_layernorm on the latent (the cache holds the normalised latent)":
            (a[:, :r], k_pe),
        "normalises the latent without kv_a_layernorm's weight": (_rms_norm(a[:, :r], torch.ones(r), eps), k_pe),
        "takes the RoPE key from the front of kv_a_proj_with_mqa's output (the latent "
        "comes first, then the RoPE key)": (_rms_norm(a[:, rope:], w["kv_a_layernorm.weight"], eps),
                                            _rope_interleaved(a[:, :rope], pos, theta)),
    }


@answer_code
def _mla_variant(w, cfg, q_nope, q_pe, pos, c_kv, k_pe, scale: float, rope_score=True, causal=True,
                 kv_split="per_head"):
    """Naive MLA attention with one thing changed, to name what a wrong answer did; (q_nope, q_pe): the
    reference's mla_query, `scale`: the softmax scale to use."""
    S, T = c_kv.shape[0], q_nope.shape[0]
    H, nope, vd = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    kv = c_kv @ w["kv_b_proj.weight"].T
    if kv_split == "per_head":
        kv = kv.view(S, H, nope + vd)
        k_nope, v = kv[..., :nope], kv[..., nope:]
    elif kv_split == "k_block_then_v_block":
        k_nope, v = kv[:, : H * nope].view(S, H, nope), kv[:, H * nope:].view(S, H, vd)
    else:  # "v_then_k"
        kv = kv.view(S, H, nope + vd)
        v, k_nope = kv[..., :vd], kv[..., vd:]
    s = torch.einsum("thn,shn->hts", q_nope, k_nope)
    if rope_score:
        s = s + torch.einsum("thp,sp->hts", q_pe, k_pe)
    s = s * scale
    if causal:
        s = s.masked_fill(torch.arange(S)[None, :] > pos[:, None], float("-inf"))
    o = torch.einsum("hts,shv->thv", s.softmax(-1), v)
    return o.reshape(T, H * vd) @ w["o_proj.weight"].T


@answer_code
def _mla_mistakes(w, cfg, q_nope, q_pe, pos, c_kv, k_pe, scale: float, absorbed: bool) -> dict:
    """The usual wrong MLA outputs; (q_nope, q_pe): the reference's mla_query, `scale`: its mla_scale."""
    args = (w, cfg, q_nope, q_pe, pos, c_kv, k_pe)
    nope, rope, r = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["kv_lora_rank"]
    out = {
        "scales scores by 1/sqrt(qk_nope_head_dim) instead of 1/sqrt(qk_nope_head_dim + "
        "qk_rope_head_dim)": _mla_variant(*args, scale=nope ** -0.5),
        "scales scores by 1/sqrt(v_head_dim) instead of 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)":
            _mla_variant(*args, scale=cfg["v_head_dim"] ** -0.5),
        "drops the RoPE part of the score (add q_pe . k_pe to q_nope . k_nope)":
            _mla_variant(*args, scale, rope_score=False),
        "splits kv_b_proj's output as [all heads' K | all heads' V]; it is per head "
        "[k_nope, v], viewed as [S, H, nope + v]": _mla_variant(*args, scale, kv_split="k_block_then_v_block"),
        "takes v before k_nope within each head (per head it is [k_nope, v])":
            _mla_variant(*args, scale, kv_split="v_then_k"),
    }
    if q_nope.shape[0] > 1:
        out["does not apply the causal mask (the query at position p sees cached tokens 0..p)"] = \
            _mla_variant(*args, scale, causal=False)
    if absorbed:
        out["scales scores by 1/sqrt(kv_lora_rank + qk_rope_head_dim), the latent width; the "
            "scale stays that of the per-head query, 1/sqrt(qk_nope + qk_rope)"] = \
            _mla_variant(*args, scale=(r + rope) ** -0.5)
    return out


def _mla_attention_cases(t) -> list:
    """(label, (cfg, S, T, start)). The visible prefill has v_head_dim != qk_nope_head_dim, so that the
    two wrong scales give different outputs on every seed."""
    tiny = dict(t.ref.MLA_TINY)
    visible = [("visible: decode, MLA_TINY", (tiny, 9, 1, 0)),
               ("visible: prefill, MLA_TINY without q_lora, v_head_dim 24",
                ({**tiny, "q_lora_rank": None, "v_head_dim": 24}, 6, 6, 0))]
    hidden = []
    for kind in ("decode", "chunk of a prompt"):
        S = t.rng.randint(3, 20)
        T = 1 if kind == "decode" else t.rng.randint(2, S)
        hidden.append((_rand_mla_cfg(t), S, T, t.rng.choice([0, 5])))
    return t.cases(visible=visible, hidden=hidden)


def _run_mla_attention(t, name: str, absorbed: bool):
    R = t.ref
    for label, (cfg, S, T, start) in _mla_attention_cases(t):
        with t.case(f"{label}, {T} new token(s), {S + start} in the cache; {_mla_repr(cfg)}"):
            w, _, _, c_kv, k_pe, x, pos = _mla_setup(t, cfg, S, T, start)
            expected = R.mla_attention_naive(w, cfg, x, pos, c_kv, k_pe)
            got = t.call(name, w, cfg, x, pos, c_kv, k_pe)
            q_nope, q_pe = R.mla_query(w, cfg, x, pos)
            if compare(got, expected) is not None:  # a wrong mla_query (Exercise 3.1) is blamed, not this function
                t.blame_upstream(name, "mla_query", [((w, cfg, x, pos), (q_nope, q_pe))], rtol=None,
                                 shown="these weights and tokens")
            t.expect(got, expected, "attention output",
                     mistakes=_mla_mistakes(w, cfg, q_nope, q_pe, pos, c_kv, k_pe, R.mla_scale(cfg), absorbed))


@check(points=3, section="3.2", timeout=10)
def mla_attention_naive(t):
    """MLA attention from the latent cache, decompressed into per-head K and V."""
    _run_mla_attention(t, "mla_attention_naive", absorbed=False)


@check(points=3, section="3.3", timeout=10)
def mla_attention_absorbed(t):
    """MLA attention with W_UK absorbed into the query and W_UV after the sum, equal to the naive form."""
    _run_mla_attention(t, "mla_attention_absorbed", absorbed=True)
    with t.case("stays in latent space: no per-head K or V of the cached tokens is built"):
        # Sizes all distinct, so any [S, ...] tensor carrying a per-head K/V width gives itself away.
        cfg = {"hidden_size": 56, "num_attention_heads": 3, "q_lora_rank": None, "kv_lora_rank": 28,
               "qk_nope_head_dim": 12, "qk_rope_head_dim": 4, "v_head_dim": 20, "rope_theta": 10000.0}
        S = 41
        w, _, _, c_kv, k_pe, x, pos = _mla_setup(t, cfg, S, 1)
        H, nope, vd, rope = 3, 12, 20, 4
        widths = {nope, vd, nope + vd, nope + rope, H * nope, H * vd, H * (nope + vd)}
        expected = t.ref.mla_attention_naive(w, cfg, x, pos, c_kv, k_pe)
        got = t.run(watch_shapes, t.learner("mla_attention_absorbed"), S, widths, w, cfg, x, pos, c_kv, k_pe,
                    what="mla_attention_absorbed")
        t.expect(got["out"], expected, "attention output")
        seen = got["seen"]
        t.expect_true(seen == [], f"your code built tensors of shape {seen[:3]!r} from the {S} cached tokens. "
                      + looks_like("decompresses the cache into per-head K/V: the absorbed form keeps every [S, ...] "
                                   "tensor in latent space (c_kv, k_pe, the scores)", end=""))
