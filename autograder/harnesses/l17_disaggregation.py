"""The learner side of lesson 17's checks (autograder/harnesses/__init__.py): the layout of the learner's packed
buffer (which the wire cannot show), and a prefill engine and a decode engine shipping KV with the learner's
pack_kv/unpack_kv (reference_engine.disagg.DisaggPair), reported as plain data."""
from __future__ import annotations

import random

from autograder.harnesses import harness


@harness
def pack_layout(pack, k, v, table, n) -> dict:
    """(A harness: runs in the learner's process.) What the wire cannot show (it sends a tensor's values, made
    contiguous): whether pack_kv's buffer is contiguous, as a transport that sends its storage needs."""
    out = pack(k, v, table, n)
    return {"contiguous": bool(out.is_contiguous()), "stride": list(out.stride())}


ENGINE_KW = {"block_size": 4, "num_blocks": 48, "max_num_seqs": 8, "max_num_batched_tokens": 32}


def engine_kw(work: dict) -> dict:
    """ENGINE_KW, with the workload's KV cache dtype when it names one (fp8: the packed buffer is uint8 bytes)."""
    return {**ENGINE_KW, **({"kv_cache_dtype": work["kv_cache_dtype"]} if "kv_cache_dtype" in work else {})}


@harness
def pair_harness(pack, unpack, work: dict, scramble: bool = True) -> dict:
    """(A harness: runs in the learner's process under `t.run`.) The shipped draft model as a prefill engine and
    a decode engine, the KV shipped with `pack`/`unpack` over the loopback link, two messages per step, the
    free block lists shuffled first (so block tables are not in order), `work["aborts"]` = {step: [request
    index]} aborted at that step on both sides. Returns plain data shaped as harnesses/engine.py's run record
    (what autograder/checks/_engine.judged reads): "tokens" per request (None if aborted or unfinished),
    "steps", "finished", "error" (None, or {"type", "message", "tb"}), "leak" (None, or the free blocks of both
    sides before and after and what the pools' consistency check says)."""
    import torch as _torch

    from autograder.harnesses.engine import DRAFT, _error
    from reference_engine import SamplingParams
    from reference_engine.disagg import DisaggPair
    from reference_engine.engine import LLMEngine
    _torch.set_num_threads(1)
    engines = [LLMEngine(str(DRAFT), dtype=_torch.float32, **engine_kw(work)) for _ in range(2)]
    if scramble:
        for i, e in enumerate(engines):
            random.Random(work["seed"] + i).shuffle(e.block_manager.allocator._free)
    pair = DisaggPair(*engines, pack=pack, unpack=unpack, messages_per_step=2)
    before = list(pair.free_blocks())
    ids = [pair.add_request(p, SamplingParams(temperature=0, max_tokens=m, ignore_eos=True))
           for p, m in zip(work["prompts"], work["lens"])]
    done, step, error = {}, 0, None
    try:
        while pair.has_unfinished() and step < 2000:
            for i in work["aborts"].get(step, []):
                pair.abort(ids[i])
            for out in pair.step():
                if out.finished and out.output is not None and out.finish_reason != "abort":
                    done[out.request_id] = out.output.token_ids
            step += 1
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - reported as data, judged in the grader
        error = _error(e)
    leaks = []
    for side, e in zip(("prefill", "decode"), engines):
        try:
            e.block_manager.check_consistency([s for seqs in e.requests.values() for s in seqs])
        except Exception as exc:  # noqa: BLE001
            leaks.append(f"{side}: {exc}")
    after = list(pair.free_blocks())
    leak = None if after == before and not leaks else \
        f"KV blocks leaked: free (prefill, decode) {before} before, {after} after. " + "; ".join(leaks)
    return {"tokens": [done.get(i) for i in ids], "steps": step, "finished": not pair.has_unfinished(),
            "error": error, "leak": leak}
