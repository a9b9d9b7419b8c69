"""The learner side of lesson 14's checks (autograder/harnesses/__init__.py): a speculative greedy loop over the
shipped draft and target models with a verifier plugged in (the learner's, or in the grader the rule and its usual
wrong versions), and the learner's rejection sampler called many times with one seeded generator. The engine with
the learner's verifier is autograder/harnesses/engine.py's run_speculative."""
from __future__ import annotations

from functools import lru_cache

import torch

from autograder.harnesses import harness
from reference_engine.shipped import CHECKPOINTS as CKPT


@lru_cache(maxsize=None)
def shipped_model(name: str):
    """The shipped target or draft model, loaded once per process (the harnesses only run its forward)."""
    from reference_engine.tools import train
    return train.load_checkpoint(CKPT / name)


@harness
def greedy_loop(verify_fn, prompts: list, gamma: int, max_new: int) -> dict:
    """(A harness: runs in the learner's process under `t.run`, and here with `greedy_rule`.) Speculative greedy
    decoding with the shipped draft and target, every forward recomputed from the whole sequence: per step the
    draft proposes `gamma` argmax tokens, the target scores gamma + 1 positions in one forward, and
    verify_fn(logits [gamma + 1, V], drafts [gamma]) says what is emitted. Returns {"tokens": per prompt its
    first max_new new tokens, "problem": None, or what a verify_fn return value broke}."""
    torch.set_num_threads(1)
    target, draft = (shipped_model(name) for name in ("target", "draft"))
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            while len(ids) - len(prompt) < max_new:
                drafts = []
                for _ in range(gamma):
                    drafts.append(int(draft(torch.tensor([ids + drafts]))[0, -1].argmax()))
                logits = target(torch.tensor([ids + drafts]))[0, len(ids) - 1:]
                emitted = verify_fn(logits, torch.tensor(drafts))
                if not isinstance(emitted, list) or not all(type(x) is int for x in emitted):
                    return {"tokens": None, "problem": f"verify_greedy returned {type(emitted).__name__} "
                                                       f"{str(emitted)[:60]}, not a list of Python ints"}
                if not 1 <= len(emitted) <= gamma + 1:
                    return {"tokens": None, "problem": f"verify_greedy returned {len(emitted)} tokens for {gamma} "
                                                       f"drafts (a step emits 1 to {gamma + 1})"}
                ids += emitted
            out.append(ids[len(prompt):len(prompt) + max_new])
    return {"tokens": out, "problem": None}


@harness
def sample_verify(verify_fn, target_probs, draft_probs, drafts, seed: int) -> dict:
    """(A harness: runs in the learner's process under `t.run`.) verify_fn(target_probs, draft_probs, drafts[j],
    generator) for every row j of drafts, one torch.Generator seeded with `seed` for all of them. Returns
    {"outputs": the return values (None if one is not a list of ints), "problem": None or what is wrong,
    "deterministic": whether the first 50 calls, rerun with a fresh generator of the same seed, return the
    same, "modified": whether an argument changed}."""
    before = (target_probs.clone(), draft_probs.clone(), drafts.clone())
    changed = lambda: not all(torch.equal(a, b) for a, b in zip(before, (target_probs, draft_probs, drafts)))
    gen = torch.Generator().manual_seed(seed)
    outputs = []
    for row in drafts:
        try:
            out = verify_fn(target_probs, draft_probs, row.clone(), gen)
        except Exception as e:
            if not changed():
                raise
            # the error is a consequence: a later call read the probabilities an earlier call overwrote
            return {"outputs": None, "problem": f"verify modified its argument target_probs or draft_probs in "
                    f"place (call {len(outputs) + 1} then raised {type(e).__name__}: {str(e)[:80]}); compute the "
                    "residual into a new tensor, the caller still needs the probabilities",
                    "deterministic": True, "modified": True}
        if not isinstance(out, list) or not all(type(x) is int for x in out):
            return {"outputs": None, "problem": f"verify returned {type(out).__name__} {str(out)[:60]}, not a list "
                                                "of Python ints", "deterministic": True, "modified": False}
        outputs.append(out)
    gen = torch.Generator().manual_seed(seed)
    again = [verify_fn(target_probs, draft_probs, row.clone(), gen) for row in drafts[:50]]
    return {"outputs": outputs, "problem": None, "deterministic": again == outputs[:50], "modified": changed()}


def _answering(own, table: dict):
    """A stand-in for the learner's function `own`: the value `table` holds for these arguments (bound to
    `own`'s parameters, so keyword calls find them too), else `own`'s own answer."""
    import inspect

    try:
        sig = inspect.signature(own)
    except (TypeError, ValueError):
        sig = None

    def stand_in(*args, **kwargs):
        key = args
        if kwargs and sig is not None:
            try:
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                key = tuple(bound.args)
            except TypeError:
                key = None
        if key in table:
            return table[key]
        return own(*args, **kwargs)

    return stand_in


@harness
def call_with_upstream(fn, upstream: list, args: list):
    """(A harness: runs in the learner's process under `t.run`.) fn(*args), with the learner's exercises that fn
    builds on answering from the grader's tables while it runs: upstream = [(name, [(arguments, value), ...]),
    ...]. A call with arguments a table does not hold goes to the learner's own function. So a check grades one
    function on right values of the functions it calls, and a mistake in those is named by their own check."""
    module = fn.__globals__
    saved = {name: module[name] for name, _ in upstream if name in module}
    try:
        for name, table in upstream:
            if name in saved:
                module[name] = _answering(saved[name], {tuple(a): v for a, v in table})
        return fn(*args)
    finally:
        module.update(saved)


@harness
def sample_tree_verify(verify_fn, target_probs, draft_probs, token_rows: list, parents: list, seed: int) -> dict:
    """(A harness: runs in the learner's process under `t.run`.) verify_fn(target_probs, draft_probs, tokens,
    parents, generator) for every tree `tokens` of token_rows, one torch.Generator seeded with `seed` for all.
    Returns {"outputs": the return values, "problem": None or what is wrong, "modified": whether an argument
    changed}."""
    before = (target_probs.clone(), draft_probs.clone(), list(parents))
    gen = torch.Generator().manual_seed(seed)
    outputs = []
    for tokens in token_rows:
        out = verify_fn(target_probs, draft_probs, list(tokens), list(parents), gen)
        if not isinstance(out, list) or not all(type(x) is int for x in out):
            return {"outputs": None, "problem": f"verify_tree returned {type(out).__name__} {str(out)[:60]}, not a "
                                                "list of Python ints", "modified": False}
        outputs.append(out)
    modified = not (torch.equal(before[0], target_probs) and torch.equal(before[1], draft_probs))
    return {"outputs": outputs, "problem": None, "modified": modified}
