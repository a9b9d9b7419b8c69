"""Lesson 19: the reference answers against independent sources (per-sequence SDPA, brute force,
a second batcher, the engine itself), and the lesson's files in shape."""
import itertools
import json
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from autograder.checks import _attention
from autograder.checks import l19_offline_batch as checks
from autograder.runner import Target, grade_lesson
from reference_engine.shipped import TARGET
from solutions import l19_offline_batch as sol

STEM = "l19_offline_batch"


# -- packing and the mask -----------------------------------------------------------------------

def test_pack_prompts_by_hand():
    b = sol.pack_prompts([[7], [3, 4, 5], [9]])
    assert b["input_ids"].tolist() == [7, 3, 4, 5, 9] and b["input_ids"].dtype == torch.int64
    assert b["cu_seqlens"].tolist() == [0, 1, 4, 5] and b["cu_seqlens"].dtype == torch.int32
    assert b["positions"].tolist() == [0, 0, 1, 2, 0] and b["positions"].dtype == torch.int64
    assert b["max_seqlen"] == 3 and isinstance(b["max_seqlen"], int)
    for bad in ([], [[1], []]):
        with pytest.raises(ValueError):
            sol.pack_prompts(bad)


@given(st.lists(st.integers(1, 9), min_size=1, max_size=6))
@settings(max_examples=40, deadline=None)
def test_mask_equals_its_definition(lengths):
    cu = checks.cu_of(lengths)
    seq_of = [s for s, n in enumerate(lengths) for _ in range(n)]
    T = len(seq_of)
    truth = torch.tensor([[seq_of[i] == seq_of[j] and j <= i for j in range(T)] for i in range(T)])
    assert torch.equal(sol.varlen_causal_mask(cu), truth)
    b = sol.pack_prompts([[1] * n for n in lengths])
    assert torch.equal(b["cu_seqlens"], cu)
    assert b["positions"].tolist() == [j for n in lengths for j in range(n)]


# -- packed attention ---------------------------------------------------------------------------

def _cases(n, seed):
    rng = random.Random(seed)
    for _ in range(n):
        H_kv, g = rng.choice([1, 2, 4]), rng.choice([1, 2, 4])
        yield [rng.randint(1, 12) for _ in range(rng.randint(1, 5))], H_kv * g, H_kv, rng.choice([8, 16, 32])


@pytest.mark.parametrize("lengths,H,H_kv,D", list(_cases(10, seed=3)))
def test_packed_attention_equals_each_sequence_alone(lengths, H, H_kv, D):
    g = torch.Generator().manual_seed(sum(lengths) * 7 + H)
    T = sum(lengths)
    q, k, v = torch.randn(T, H, D, generator=g), torch.randn(T, H_kv, D, generator=g), torch.randn(T, H_kv, D, generator=g)
    cu = checks.cu_of(lengths)
    out, start = [], 0
    for n in lengths:   # torch's own GQA path, independent of repeat_interleave
        sl = slice(start, start + n)
        out.append(F.scaled_dot_product_attention(q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1),
                                                  is_causal=True, enable_gqa=True).transpose(0, 1))
        start += n
    truth = torch.cat(out)
    torch.testing.assert_close(sol.packed_attention(q, k, v, cu), truth, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(checks.per_sequence_sdpa(q, k, v, cu), truth, rtol=1e-4, atol=1e-5)
    # a named mistake that equals the right answer here would be named for right code
    for name, wrong in checks.attention_mistakes(q, k, v, cu, None).items():
        if len(lengths) == 1 and ("across sequences" in name):
            continue  # one sequence: nothing to cross
        assert not torch.allclose(wrong, truth, rtol=1e-4, atol=1e-5), name


def test_packed_attention_keeps_dtype_and_honours_scale():
    q = torch.randn(6, 4, 8, dtype=torch.float64)
    k = v = torch.randn(6, 2, 8, dtype=torch.float64)
    cu = checks.cu_of([2, 4])
    assert sol.packed_attention(q, k, v, cu).dtype == torch.float64
    torch.testing.assert_close(sol.packed_attention(q, k, v, cu, 0.3), checks.per_sequence_sdpa(q, k, v, cu, 0.3))


# -- first-fit decreasing -------------------------------------------------------------------------

def _optimum(costs, budget):
    """Fewest packed batches, by brute force over assignments (tiny inputs only)."""
    n = len(costs)
    for k in range(1, n + 1):
        for assign in itertools.product(range(k), repeat=n):
            loads = [0] * k
            for c, b in zip(costs, assign):
                loads[b] += c
            if max(loads) <= budget:
                return k
    return n


@given(st.lists(st.integers(1, 10), min_size=1, max_size=7), st.integers(10, 16))
@settings(max_examples=60, deadline=None)
def test_ffd_is_valid_and_within_its_proven_bound(costs, budget):
    batches = sol.form_batches(costs, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(costs)))
    assert all(sol.batch_tokens(costs, b) <= budget for b in batches)
    opt = _optimum(costs, budget)
    assert opt <= len(batches) <= 11 / 9 * opt + 6 / 9   # Dósa (2007): FFD <= 11/9 OPT + 6/9


@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(8, 64), st.booleans())
@settings(max_examples=60, deadline=None)
def test_ffd_handles_oversize_and_padded(costs, budget, padded):
    batches = sol.form_batches(costs, budget, padded)
    assert sorted(i for b in batches for i in b) == list(range(len(costs)))
    for b in batches:
        if any(costs[i] > budget for i in b):
            assert len(b) == 1
        else:
            assert sol.batch_tokens(costs, b, padded) <= budget
    assert checks.canonical(checks._pack(costs, budget, padded)) == checks.canonical(batches)


def test_ffd_rejects_bad_budgets():
    for costs, budget in [([1, 2], 0), ([0, 2], 5)]:
        with pytest.raises(ValueError):
            sol.form_batches(costs, budget)


# -- the batching window --------------------------------------------------------------------------

def _window_by_events(arrivals, window, cap):
    """A second batcher, written as an event loop: a batch closes on a deadline or on a full count."""
    dispatch, sizes, current, deadline = [None] * len(arrivals), [], [], None
    for i, a in enumerate(arrivals):
        if current and a > deadline:
            for j in current:
                dispatch[j] = deadline
            sizes.append(len(current))
            current = []
        if not current:
            deadline = a + window
        current.append(i)
        if cap is not None and len(current) == cap:
            for j in current:
                dispatch[j] = a
            sizes.append(len(current))
            current = []
    for j in current:
        dispatch[j] = deadline
    if current:
        sizes.append(len(current))
    return dispatch, sizes


@given(st.lists(st.integers(0, 40), min_size=0, max_size=40), st.integers(0, 8), st.one_of(st.none(), st.integers(1, 6)))
@settings(max_examples=80, deadline=None)
def test_window_matches_an_event_loop(ticks, window_ticks, cap):
    arrivals = sorted(t * 0.125 for t in ticks)      # exact binary fractions: ties on a window's end happen
    window = window_ticks * 0.125
    r = sol.batch_window_delays(arrivals, window, cap)
    dispatch, sizes = _window_by_events(arrivals, window, cap)
    assert r["dispatch"] == dispatch and r["batch_sizes"] == sizes
    assert all(0 <= d <= window + 1e-12 for d in r["delay"])
    if arrivals:
        assert r["mean"] == pytest.approx(sum(r["delay"]) / len(arrivals)) and r["max"] == max(r["delay"])


# -- memory: the static bound is the engine's preemption-free limit --------------------------------

def test_max_batch_in_memory_by_hand():
    llama8b = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    assert sol.max_batch_in_memory(llama8b, 2, 60e9, 1536, 512) == int(60e9 // (2048 * 131_072))
    # 1000 + 210 tokens -> 76 blocks of 16 = 1216 tokens; plus 1000 * 1e5 bytes of activations
    assert sol.max_batch_in_memory(llama8b, 2, 40e9, 1000, 210, 1e5, 16) == int(40e9 // (1216 * 131_072 + 1e8))
    assert sol.max_batch_in_memory(llama8b, 2, -1e9, 10, 10) == 0


def test_given_kv_helper_is_lesson_02s_formula():
    """kv_bytes_per_token (given, from the engine) equals lesson 02's graded answer on every config trap."""
    from autograder.checks._configs import NULL_FIELDS_7B, random_config
    from solutions import l02_kv_cache as l02
    rng = random.Random(19)
    for cfg in [checks.LLAMA_3_8B, checks.LLAMA_3_70B, checks.MHA_7B, NULL_FIELDS_7B] + \
            [random_config(rng) for _ in range(200)]:
        for b in (1, 2, 4):
            assert sol.kv_bytes_per_token(cfg, b) == l02.kv_bytes_per_token(cfg, b), cfg


def test_static_bound_is_where_the_engine_starts_preempting():
    """B uniform sequences that max_batch_in_memory says fit run without preemption in a cache of
    exactly that size; one more sequence makes the engine preempt."""
    torch.set_num_threads(1)
    from reference_engine import LLM, SamplingParams
    cfg = json.loads((TARGET / "config.json").read_text())
    p, o, block = 40, 24, 16                        # 64 tokens: 63 ever written to the cache, 4 blocks either way
    num_blocks = 4 * 5 + 3                          # room for 5 whole sequences, and 3 blocks to spare
    kv_bytes = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4   # fp32 on CPU
    B = sol.max_batch_in_memory(cfg, 4, num_blocks * block * kv_bytes, p, o, 0.0, block)
    assert B == 5
    params = SamplingParams(temperature=0, max_tokens=o, ignore_eos=True)
    for n, preempts in [(B, False), (B + 1, True)]:
        llm = LLM(model=str(TARGET), num_blocks=num_blocks, max_num_seqs=n, block_size=block, device="cpu",
                  dtype="float32")
        outs = llm.generate([[5 + i] * p for i in range(n)], params)
        assert all(len(x.token_ids) == o for x in outs)
        assert (sum(x.metrics.num_preemptions for x in outs) > 0) == preempts, n


# -- the lesson's files -------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 12345])
def test_solutions_earn_full_marks(seed):
    res = grade_lesson(STEM, Target.for_lesson(STEM, solutions=True), seed)
    assert [(r.name, r.status, r.message) for r in res if r.status != "passed"] == []


def test_untouched_stubs_are_not_started():
    res = grade_lesson(STEM, Target.for_lesson(STEM), 0)
    assert {r.status for r in res} == {"not started"} and sum(r.earned for r in res) == 0


def test_named_mistakes_differ_from_the_right_answers():
    """On the visible cases, no named mistake equals the right answer (it could never be named)."""
    for prompts in ([[5, 6, 7], [8, 9]], [[7], [3, 4, 5], [9]]):
        b = sol.pack_prompts(prompts)
        for name, wrong in {**checks.cu_seqlens_mistakes(prompts), **checks.positions_mistakes(prompts)}.items():
            right = b["positions"] if "position" in name else b["cu_seqlens"]
            assert not (wrong.shape == right.shape and wrong.dtype == right.dtype and torch.equal(wrong, right)), name
    grid = [0.125, 0.375, 0.625, 0.875, 1.625, 1.875, 3.125]
    seen = {}
    for cap in (None, 2):       # each mistake must show on at least one of the two visible grids
        right = sol.batch_window_delays(grid, 0.5, cap)
        for name, wrong in checks.window_mistakes(grid, 0.5, cap).items():
            seen[name] = seen.get(name, False) or wrong != right
    assert all(seen.values()), [n for n, s in seen.items() if not s]
    seen = {}
    for args in [(checks.LLAMA_3_8B, 2, 60e9, 1536, 512, 0.0, 1), (checks.LLAMA_3_70B, 2, 40e9, 1000, 210, 100e3, 16),
                 (checks.LLAMA_3_8B, 2, 10e9, 20, 5, 0.0, 16), (checks.MHA_7B, 1, 24e9, 3000, 500, 0.0, 16),
                 (checks.LLAMA_3_8B, 2, -5e9, 512, 128, 0.0, 16)]:     # the check's visible cases
        right = sol.max_batch_in_memory(*args)
        cfg, nbytes, *rest = args
        for name, wrong in checks.memory_mistakes(sol.kv_bytes_per_token(cfg, nbytes), *rest).items():
            seen[name] = seen.get(name, False) or wrong != right
    assert all(seen.values()), [n for n, s in seen.items() if not s]


def test_the_bf16_case_tells_attention_in_bf16_apart_on_every_seed():
    from autograder.compare import compare
    q, k, v = _attention.bf16_qkv(16)  # fixed: the same tensors on every seed
    cu = checks.cu_of([10, 6])
    exact = checks.per_sequence_sdpa(q.double(), k.double(), v.double(), cu).bfloat16()
    assert compare(sol.packed_attention(q, k, v, cu), exact) is None
    in_bf16 = checks.masked_attention(q, k, v, checks.varlen_mask(cu), 32 ** -0.5, acc=torch.bfloat16)
    assert compare(in_bf16, exact) is not None


def test_prefill_tokens_with_a_prefix_cache():
    prefix_of, suffix = [0, 1, 2, 0, 1, 2], [10] * 6
    assert sol.prefill_tokens(list(range(6)), prefix_of, 100, suffix, 0) == 6 * 110          # no cache
    assert sol.prefill_tokens(list(range(6)), prefix_of, 100, suffix, 2) == 6 * 110          # round-robin thrashes LRU
    assert sol.prefill_tokens(list(range(6)), prefix_of, 100, suffix, 3) == 3 * 100 + 60     # all prefixes fit
    grouped = sorted(range(6), key=lambda i: prefix_of[i])
    assert sol.prefill_tokens(grouped, prefix_of, 100, suffix, 1) == 3 * 100 + 60            # sorted: each prefix once


def test_the_first_form_batches_case_tells_every_packer_apart():
    costs, budget = [1, 5, 8, 1, 4], 10
    ref = checks.canonical(sol.form_batches(costs, budget))
    variants = {**checks.batching_mistakes(costs, budget, False), **checks.assignment_mistakes(costs, budget, False)}
    groupings = [checks.canonical(v) for name, v in variants.items() if not name.startswith("breaks cost ties")]
    assert ref not in groupings and len({str(g) for g in groupings}) == len(groupings)
