"""The learner side of lesson 04's checks (autograder/harnesses/__init__.py): what runs in the learner's process
under `t.run`. The allocator's answers to the op-by-op driver's queries in one round trip, fork's aliasing seen from
there, seeded sampling in the engine with the learner's allocator, the decode with a strided block table (a tensor
crosses the wire as a contiguous copy), and the paged decode timed on CUDA; plus the random decode inputs, which
the checks and the timing build alike."""
from __future__ import annotations

import random

import torch

from autograder.harnesses import harness
from autograder.harnesses.engine import build_llm, consistency
from autograder.harnesses.timing import seconds_per_call


@harness
def observe(allocator, blocks: list[int], ks: list[int]) -> dict:
    """(A harness: runs in the learner's process under `t.run`.) What _Drive.check reads after every operation,
    in one round trip: {"ref_count": per block, "num_free": [one], "can_allocate": per k}, each entry
    ("ok", value) or ("raised", the exception described as the grader describes a raising call). A value that
    is not a plain int, bool, float, str or None comes back as its repr, which no check accepts."""
    from autograder.learner_side import describe_exception

    def ask(fn, *args):
        try:
            v = fn(*args)
        except Exception as e:  # noqa: BLE001 - reported to the grader as that call's failure
            return "raised", describe_exception(e)
        return "ok", v if type(v) in (int, bool, float, str, type(None)) else f"<{type(v).__name__} {str(v)[:40]}>"
    return {"ref_count": [ask(allocator.ref_count, b) for b in blocks], "num_free": [ask(allocator.num_free)],
            "can_allocate": [ask(allocator.can_allocate, k) for k in ks]}


@harness
def fork_aliasing(allocator_cls) -> dict:
    """(A harness: runs in the learner's process under `t.run`.) fork a two-block table, then copy-on-write
    the child's last block through append_slot, which edits the child's list in place. Returns whether fork
    returned the parent's own list object and the parent's table afterwards (it must be unchanged)."""
    a = allocator_cls(4)
    parent = [a.allocate(), a.allocate()]
    before = list(parent)
    child = a.fork(parent)
    same = child is parent
    a.append_slot(child)
    return {"same_object": same, "parent_before": before, "parent_after": list(parent)}


@harness
def sample_in_engine(prompts: list, llm_kwargs: dict, n: int, max_tokens: int, seed: int) -> dict:
    """(A harness: runs where it is called, in the learner's process under `t.run`.) Seeded sampling of
    `n` completions per prompt, EOS ignored: after the prompt's prefill the engine forks the sequence,
    and the children share its blocks until they write. Returns {"tokens": per prompt, per completion,
    token ids; "num_blocks", "free_blocks", "leak" (None or harnesses.engine.consistency's message)}."""
    from reference_engine import SamplingParams
    llm = build_llm(llm_kwargs)
    params = SamplingParams(temperature=1.0, seed=seed, n=n, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate(prompts, params)
    engine = llm.engine
    return {"tokens": [[list(c.token_ids) for c in o.outputs] for o in outs], "num_blocks": engine.num_blocks,
            "free_blocks": engine.block_manager.num_free(), "leak": consistency(engine)}


def make_decode_case(gen, rng, B, H, H_kv, D, bs, lens, dtype=torch.float32, device="cpu", strided=False,
                     scale=None, q_scale=1.0):
    """Random q, caches and block tables; each sequence gets distinct shuffled blocks, padded with junk ids.

    strided: the block table is a view into a wider buffer (row stride > width), as an engine's
    persistent [max_seqs, max_blocks] table sliced to this batch would be. scale: the softmax scale
    passed (None: 1/sqrt(head_dim), the Llama one); q_scale: larger queries, sharper softmax."""
    need = [-(-n // bs) for n in lens]
    width = max(need)
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    rows, at = [], 0
    for n in need:
        rows.append(perm[at:at + n] + [rng.randrange(num_blocks) for _ in range(width - n)])
        at += n
    table = torch.tensor(rows, dtype=torch.int32)
    if strided:
        wide = torch.randint(0, num_blocks, (B, width + 3), generator=gen, dtype=torch.int32)
        wide[:, :width] = table
        table = wide[:, :width]
    q = torch.randn(B, H, D, generator=gen) * q_scale
    kc = torch.randn(num_blocks, bs, H_kv, D, generator=gen)
    vc = torch.randn(num_blocks, bs, H_kv, D, generator=gen)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    return (q.to(device, dtype), kc.to(device, dtype), vc.to(device, dtype), table.to(device),
            lens_t.to(device), D ** -0.5 if scale is None else scale)


@harness
def call_with_table_view(fn, q, k_cache, v_cache, wide_tables, width: int, context_lens, scale):
    """(A harness: runs in the learner's process.) fn with block_tables = wide_tables[:, :width], a view
    whose row stride exceeds its width: a tensor crosses between processes as a contiguous copy."""
    return fn(q, k_cache, v_cache, wide_tables[:, :width], context_lens, scale)


@harness
def time_decode(fn, lens: list[int], seed: int, reps: int = 20) -> dict:
    """(A harness: runs in the learner's process, on CUDA.) Seconds per call of `fn` and of the engine's
    Triton paged decode on the same bf16 inputs (64 seqs, 32 heads on 8 KV heads, head_dim 128,
    blocks of 16), built there: copying gigabytes of cache per call would swamp the timing."""
    from reference_engine.kernels import triton_kernels
    gen = torch.Generator().manual_seed(seed)
    args = make_decode_case(gen, random.Random(seed), len(lens), 32, 8, 128, 16, lens, torch.bfloat16, "cuda")
    return {"mine": seconds_per_call(lambda: fn(*args), reps),
            "ref": seconds_per_call(lambda: triton_kernels().paged_decode_triton(*args), reps)}
