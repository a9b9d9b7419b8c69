"""Lesson 14: speculative decoding.

A small draft model proposes gamma tokens, one forward each; the target model scores all of them in one
forward of gamma + 1 positions (each drafted token, plus one past the last), and a verification rule keeps
a prefix of the drafts and adds one token of the target's own. Every target forward therefore emits
between 1 and gamma + 1 tokens, and with the rule of section 1 the emitted text has exactly the target
model's distribution.

Notation (Leviathan et al. 2023; Chen et al. 2023 swap the letters p and q):
  p = the target's next-token distribution, q = the draft's; k = gamma = drafted tokens per step;
  alpha = the probability that a drafted token is accepted; c = the cost of one draft forward over the
  cost of one target forward (a decode step of the same batch).

Sections: 1. verification (greedy, the acceptance probability, the residual distribution, the rejection
sampler); 2. the arithmetic (tokens per target step, speedup, best gamma); 3. the batch size at which
speculation stops paying, on the modeled GPU clock (reference_engine/sim/gpu_model.py). The bottom of the file
holds given helpers the notebook uses: the shipped models with a KV cache, a speculative decoding loop,
and the acceptance measurement.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

# -- 1. verification ----------------------------------------------------------------------------------


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> list[int]:
    """Exercise 1.1: greedy verification of k drafted tokens for one sequence.

    target_logits: [k + 1, V], the target's logits at the k + 1 positions it scored in one forward: row i
      (i < k) predicts the token at draft position i, given the context and draft_tokens[:i]; row k
      predicts the token after the last draft.
    draft_tokens: [k] int64, the drafted token ids.

    Walk i = 0, 1, ...: t = argmax of row i (torch.argmax: the first index on ties). If t equals
    draft_tokens[i], emit it and go on; otherwise emit t (the target's own choice) and stop. If all k
    match, emit the argmax of row k too (the bonus token). Returns the emitted token ids as a list of
    Python ints, 1 to k + 1 of them: exactly the tokens plain greedy decoding of the target would produce
    next.

    >>> logits = torch.tensor([[0., 5., 1.], [3., 0., 1.], [0., 0., 9.]])
    >>> verify_greedy(logits, torch.tensor([1, 0]))
    [1, 0, 2]
    >>> verify_greedy(logits, torch.tensor([1, 2]))
    [1, 0]
    """
    ### BEGIN SOLUTION
    best = target_logits.argmax(dim=-1).tolist()
    out = []
    for i, d in enumerate(draft_tokens.tolist()):
        out.append(best[i])
        if best[i] != d:
            return out  # the target disagrees: its own token replaces the draft, and the step ends
    out.append(best[len(out)])  # every draft accepted: the last row gives one token more
    return out
    ### END SOLUTION


def acceptance_rate(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Exercise 1.2: the probability that a token drawn from the draft is accepted, per position.

    target_probs, draft_probs: [..., V], probability rows (each sums to 1) of the target (p) and the draft
    (q) at the same positions. A drafted x ~ q is accepted with probability min(1, p(x) / q(x)), so the
    acceptance probability is E_{x~q}[min(1, p(x)/q(x))] = sum_x min(p(x), q(x)) (= 1 - the total variation
    distance between p and q). Returns a tensor of shape [...] (the last dimension summed out).

    >>> acceptance_rate(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5]))
    tensor(0.5000)
    """
    ### BEGIN SOLUTION
    return torch.minimum(target_probs, draft_probs).sum(dim=-1)
    ### END SOLUTION


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Exercise 1.3: the distribution to sample from after a rejection: norm(max(0, p - q)), per row.

    target_probs, draft_probs: [..., V] probability rows p and q. Returns [..., V]: max(0, p - q) divided by
    its sum over the last dimension. Where that sum is 0 (p == q: then a rejection never happens, so any
    distribution would do), return p itself, so that every row is a distribution.

    >>> residual_distribution(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5]))
    tensor([0.5000, 0.5000, 0.0000])
    """
    ### BEGIN SOLUTION
    excess = (target_probs - draft_probs).clamp(min=0)
    total = excess.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, excess / total.clamp(min=torch.finfo(excess.dtype).tiny), target_probs)
    ### END SOLUTION


def verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
           generator: torch.Generator) -> list[int]:
    """Exercise 1.4: the rejection sampler of Leviathan et al. 2023 / Chen et al. 2023, for one sequence.

    target_probs: [k + 1, V], the target's distributions p_0 .. p_k (row i: the token at draft position i;
      row k: the token after the last draft). draft_probs: [k, V], the draft's q_0 .. q_{k-1}, from which
      draft_tokens[i] was drawn. draft_tokens: [k] int64. generator: a torch.Generator, the only source of
      randomness.

    For i = 0, 1, ..., k - 1, with x = draft_tokens[i]:
      draw u = torch.rand((), generator=generator, dtype=target_probs.dtype, device=target_probs.device);
      if u < p_i(x) / q_i(x) (that is, with probability min(1, p_i(x) / q_i(x))), emit x and go on;
      else emit one token drawn from residual_distribution(p_i, q_i) with
        torch.multinomial(row, 1, generator=generator), and stop.
    If all k drafts were accepted, emit one more token, drawn from p_k with torch.multinomial (the bonus).

    The random draws are exactly, in order: one torch.rand per draft examined (the first rejection is the
    last one examined), then one torch.multinomial. Returns the emitted token ids, a list of 1 to k + 1
    Python ints. Do not modify the arguments.

    Why it is exact: the first emitted token is x with probability q(x) min(1, p(x)/q(x)) = min(p(x), q(x))
    from acceptance, plus P(reject) * residual(x) = max(0, p(x) - q(x)) from the resample; the sum is p(x).
    """
    ### BEGIN SOLUTION
    k = draft_tokens.shape[0]
    out = []
    for i, x in enumerate(draft_tokens.tolist()):
        u = torch.rand((), generator=generator, dtype=target_probs.dtype, device=target_probs.device)
        if u < target_probs[i, x] / draft_probs[i, x]:
            out.append(x)
            continue
        row = residual_distribution(target_probs[i], draft_probs[i])
        out.append(int(torch.multinomial(row, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(target_probs[k], 1, generator=generator)))
    return out
    ### END SOLUTION


# -- 2. the arithmetic ----------------------------------------------------------------------------------


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """Exercise 2.1: expected tokens emitted per target forward with gamma drafts, each accepted independently
    with probability alpha (Leviathan et al. 2023's i.i.d. assumption).

    Draft i is emitted only if drafts 0 .. i are all accepted (probability alpha^(i+1)), and every step emits
    one token of the target's own (the resample or the bonus): 1 + alpha + ... + alpha^gamma
    = (1 - alpha^(gamma + 1)) / (1 - alpha), which is gamma + 1 at alpha = 1. alpha in [0, 1], gamma >= 0.

    >>> expected_tokens_per_step(0.5, 2)
    1.75
    >>> expected_tokens_per_step(1.0, 4)
    5.0
    """
    ### BEGIN SOLUTION
    if alpha == 1:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)
    ### END SOLUTION


def speedup(alpha: float, gamma: int, c: float) -> float:
    """Exercise 2.2: the expected wall-time speedup of speculative decoding over plain decoding
    (Leviathan et al. 2023, Theorem 3.8): expected_tokens_per_step(alpha, gamma) / (gamma * c + 1).

    One step costs gamma draft forwards (c each, in units of one target forward) plus one target forward
    that verifies them; plain decoding gets one token per target forward. c >= 0. gamma = 0 gives 1.

    >>> round(speedup(0.8, 4, 0.05), 4)
    2.8013
    """
    ### BEGIN SOLUTION
    return expected_tokens_per_step(alpha, gamma) / (gamma * c + 1)
    ### END SOLUTION


def best_gamma(alpha: float, c: float, max_gamma: int) -> int:
    """Exercise 2.3: the gamma in 0 .. max_gamma (both included) with the largest speedup(alpha, gamma, c);
    the smallest such gamma on ties. 0 means "do not speculate": no gamma beats plain decoding.

    >>> best_gamma(0.8, 0.05, 10), best_gamma(0.3, 0.5, 10)
    (8, 0)
    """
    ### BEGIN SOLUTION
    return max(range(max_gamma + 1), key=lambda g: (speedup(alpha, g, c), -g))
    ### END SOLUTION


# -- 3. when speculation stops paying: the batch size ----------------------------------------------------


def lm_head_seconds(model: str, chip: str, rows: int) -> float:
    """Modeled seconds of the lm_head GEMM on `rows` rows (reference_engine.sim.gpu_model's roofline, at the
    chip's achievable fractions). gpu_model.step_time runs lm_head on one row per sequence, which is what a
    decode or a prefill chunk needs; verification needs gamma + 1 rows per sequence."""
    from reference_engine.sim import gpu_model as gm

    shape, c = gm.MODELS[model], gm.CHIPS[chip]
    _, m, n, k, calls = gm.gemm_shapes(shape, rows, rows)[-1]
    flops, nbytes = gm.matmul_cost(m, n, k, shape.weight_bytes)
    return calls * gm.roofline(flops, nbytes, c.peak_flops * c.gemm_eff, c.bandwidth * c.mem_eff)[0]


def model_shape(name: str):
    """A reference_engine.sim.gpu_model shape by key: a key of gpu_model.MODELS ("llama-3-8b", "llama-3-70b"), or
    "llama-3.2-1b" (gpu_model.LLAMA_3_2_1B, a draft model for the Llama-3 targets: same tokenizer)."""
    from reference_engine.sim import gpu_model as gm

    return {**gm.MODELS, "llama-3.2-1b": gm.LLAMA_3_2_1B}[name]


def modeled_speedup(model: str, chip: str, alpha: float, gamma: int, context: int, c: float | str,
                    batch: int) -> float:
    """Exercise 3.1: the speedup of speculative decoding at a decode batch of `batch` sequences, on the modeled
    GPU clock (reference_engine.sim.gpu_model).

    model: a key of gpu_model.MODELS ("llama-3-8b"); chip: a key of gpu_model.CHIPS ("H100"). Every sequence
    has `context` tokens in its KV cache. With step_time = gpu_model.step_time(MODELS[model], CHIPS[chip], ...)
    .time_s:
      t_decode = step_time of Composition.decode_batch(batch, context): one plain decode step;
      t_verify = step_time of Composition(prefills=((gamma + 1, context),) * batch): the verification forward,
                 a chunk of gamma + 1 tokens per sequence at its context (a Composition's decodes hold one
                 token each), plus lm_head_seconds(model, chip, batch * (gamma + 1))
                 - lm_head_seconds(model, chip, batch): step_time charges lm_head on one row per sequence,
                 verification needs logits at all gamma + 1 positions;
      t_draft = the seconds of one draft forward over the batch, set by c:
        a number: c * t_decode, a fixed fraction of the target's step at every batch and context ("frozen c").
          That is right for a drafter whose cost is negligible or a fixed slice of the target's own step, with
          next to no KV cache of its own: prompt lookup (n-gram), an EAGLE head (one decoder layer), MTP modules;
        a string: a separate draft model, model_shape(c) (e.g. "llama-3.2-1b"), priced by its own decode step
          at the same batch and context, gpu_model.step_time(model_shape(c), CHIPS[chip],
          Composition.decode_batch(batch, context)).time_s. Its c = t_draft / t_decode is not constant: the
          draft's KV cache per token is a larger share of the target's than its weights are, so c grows with
          batch x context.
    Returns expected_tokens_per_step(alpha, gamma) * t_decode / (gamma * t_draft + t_verify): tokens per second
    with speculation over tokens per second without. While the step is memory-bound, t_verify is close to
    t_decode and this is speedup(alpha, gamma, c); once its GEMMs are compute-bound, their time grows with the
    (gamma + 1) times more tokens verification puts in the step.
    """
    ### BEGIN SOLUTION
    from reference_engine.sim import gpu_model as gm

    shape, hw = gm.MODELS[model], gm.CHIPS[chip]
    t_decode = gm.step_time(shape, hw, gm.Composition.decode_batch(batch, context)).time_s
    t_verify = gm.step_time(shape, hw, gm.Composition(prefills=((gamma + 1, context),) * batch)).time_s
    t_verify += lm_head_seconds(model, chip, batch * (gamma + 1)) - lm_head_seconds(model, chip, batch)
    if isinstance(c, str):
        t_draft = gm.step_time(model_shape(c), hw, gm.Composition.decode_batch(batch, context)).time_s
    else:
        t_draft = c * t_decode
    return expected_tokens_per_step(alpha, gamma) * t_decode / (gamma * t_draft + t_verify)
    ### END SOLUTION


def break_even_batch(model: str, chip: str, alpha: float, gamma: int, context: int, c: float | str,
                     max_batch: int = 1024) -> int | None:
    """Exercise 3.2: the smallest batch in 1 .. max_batch at which speculation stops paying:
    modeled_speedup(model, chip, alpha, gamma, context, c, batch) <= 1. None if it still pays at max_batch.
    c as in modeled_speedup: a frozen ratio (a number) or a draft model's key (its cost at each batch).

    Once the modeled speedup is <= 1 it stays <= 1 at larger batches (with a frozen c it never rises again;
    with a draft model's c it can rise by under 1e-3 but not back above 1: the lesson's tests check both over a
    grid), so a bisection finds the same batch as a scan from 1, in about log2(max_batch) calls.
    gamma >= 1.
    """
    ### BEGIN SOLUTION
    pays = lambda b: modeled_speedup(model, chip, alpha, gamma, context, c, b) > 1
    if pays(max_batch):
        return None
    lo, hi = 0, max_batch  # speculation pays at lo (0: nothing known yet), stops paying at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pays(mid):
            lo = mid
        else:
            hi = mid
    return hi
    ### END SOLUTION


# -- 4. tree drafts: one verification forward over several candidate continuations -----------------------
#
# A tree of n nodes: node 0 is the root, the last token already emitted (the target has not run on it yet, as
# in speculative_generate); every other node i holds a drafted token and its parent parents[i], with
# 0 <= parents[i] < i (parents[0] == -1). A node's children, in index order, are candidate next tokens after
# the path root .. node. The target scores all n nodes in one forward; row i of its output predicts the token
# after the path root .. i.


def children_of(parents: list[int]) -> list[list[int]]:
    """children_of(parents)[i]: node i's children, in index order (given)."""
    kids = [[] for _ in parents]
    for i, j in enumerate(parents[1:], start=1):
        kids[j].append(i)
    return kids


def tree_attention_mask(parents: list[int], prefix_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 4.1: the attention mask and the positions of a tree's verification forward.

    parents: the tree (see above), n nodes; prefix_len: tokens already in the KV cache before the root.
    Returns (mask, positions):
      mask: bool [n, prefix_len + n]; mask[i, j] is True when node i may attend to key j: every prefix key
        (j < prefix_len), and among the tree's keys (j = prefix_len + m) node i itself and its ancestors up to
        the root, never a sibling, a cousin or a descendant: node i must see exactly the sequence root .. i.
      positions: int64 [n], the position of each node's token in its own sequence: prefix_len + depth(i), the
        root at depth 0 (siblings share a position).

    >>> mask, pos = tree_attention_mask([-1, 0, 0, 1], 2)
    >>> mask.int().tolist()
    [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 1]]
    >>> pos.tolist()
    [2, 3, 3, 4]
    """
    ### BEGIN SOLUTION
    n = len(parents)
    mask = torch.zeros(n, prefix_len + n, dtype=torch.bool)
    mask[:, :prefix_len] = True
    depth = [0] * n
    for i in range(n):
        j = i
        while j != -1:
            mask[i, prefix_len + j] = True
            j = parents[j]
        depth[i] = 0 if i == 0 else depth[parents[i]] + 1
    return mask, torch.tensor(depth, dtype=torch.long) + prefix_len
    ### END SOLUTION


def verify_tree_greedy(target_logits: torch.Tensor, tokens: list[int], parents: list[int]) -> list[int]:
    """Exercise 4.2: greedy verification of a tree of drafts.

    target_logits: [n, V], row i the target's logits after the path root .. i; tokens: the n node tokens
    (tokens[0] is the root's, already emitted); parents: the tree.

    Start at the root. At node i, t = the argmax of row i (torch.argmax: the first index on ties); emit t.
    If one of i's children holds the token t, move to the first such child and go on; otherwise stop. A leaf's
    row gives the last token (the bonus). Returns the emitted token ids as Python ints, 1 to depth + 1 of them:
    the tokens plain greedy decoding of the target produces next, whichever branch holds them.

    >>> logits = torch.tensor([[0., 0., 9.], [9., 0., 0.], [0., 9., 0.], [0., 0., 9.]])
    >>> verify_tree_greedy(logits, [5, 1, 2, 1], [-1, 0, 0, 2])
    [2, 1, 2]
    """
    ### BEGIN SOLUTION
    best, kids = target_logits.argmax(dim=-1).tolist(), children_of(parents)
    out, node = [], 0
    while True:
        out.append(best[node])
        nxt = next((c for c in kids[node] if tokens[c] == best[node]), None)
        if nxt is None:
            return out
        node = nxt
    ### END SOLUTION


def verify_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor, tokens: list[int], parents: list[int],
                generator: torch.Generator) -> list[int]:
    """Exercise 4.3: multi-candidate rejection sampling over a tree (SpecInfer's rule, with siblings drawn
    without replacement as in recursive speculative decoding).

    target_probs: [n, V], p at each node (row i: the target's distribution after the path root .. i).
    draft_probs: [n, V], q at each node: node i's children were drawn one after another from q_i without
      replacement (each from q_i with the earlier siblings' tokens removed, renormalized). tokens, parents:
      the tree, as in 4.2. generator: the only source of randomness.

    Start at the root with p = target_probs[0], q = draft_probs[0]. Try the node's children in index order;
    for child c with token x:
      draw u = torch.rand((), generator=generator, dtype=p.dtype, device=p.device);
      if u < p(x) / q(x): emit x, move to c (p, q = its rows) and try its children;
      else: p = residual_distribution(p, q) (section 1.3: norm(max(0, p - q))), and q = q with q(x) set to 0,
        renormalized (the next sibling was drawn without x); try the next child with these p and q.
    When a node has no child left to try (every child rejected, or a leaf), emit one token drawn from the
    current p with torch.multinomial(p, 1, generator=generator), and stop.
    Returns the emitted token ids, Python ints. Do not modify the arguments.

    Why it is exact: at each try, x was drawn from the current q and the fallback is the residual of the
    current p against it, so (as in section 1.4) what this try and everything after it emit follows the
    current p; by induction from the last sibling back, the token emitted at a node follows its target row.
    """
    ### BEGIN SOLUTION
    kids = children_of(parents)
    out, node = [], 0
    p, q = target_probs[0], draft_probs[0]
    while True:
        moved = False
        for c in kids[node]:
            x = tokens[c]
            u = torch.rand((), generator=generator, dtype=p.dtype, device=p.device)
            if u < p[x] / q[x]:
                out.append(x)
                node, p, q, moved = c, target_probs[c], draft_probs[c], True
                break
            p = residual_distribution(p, q)
            q = q.clone()
            q[x] = 0
            q = q / q.sum() if q.sum() > 0 else q
        if not moved:
            out.append(int(torch.multinomial(p, 1, generator=generator)))
            return out
    ### END SOLUTION


# -- given: the shipped models with a KV cache, a speculative loop, and the measurements -----------------

def checkpoints_dir() -> Path:
    """reference_engine/checkpoints (found from the package, never a fixed path)."""
    from reference_engine.shipped import CHECKPOINTS
    return CHECKPOINTS


def load_models(threads: int = 1):
    """(target, draft): the shipped ~3.3M and ~0.6M parameter Llamas (reference_engine/tools/train.py's model), fp32."""
    from reference_engine.tools import train

    torch.set_num_threads(threads)
    return tuple(train.load_checkpoint(checkpoints_dir() / name) for name in ("target", "draft"))


def tokenizer():
    """The tokenizer both shipped models share (byte-level BPE, 2048 ids)."""
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(checkpoints_dir() / "target" / "tokenizer.json"))


def heldout_contexts(n: int, length: int) -> list[list[int]]:
    """n token windows of `length` tokens, evenly spaced over the held-out files (reference_engine/tools/train.py's
    split: files whose sha1(relative path) % 20 == 0, never trained on), joined by <|endoftext|>."""
    from reference_engine.tools import train

    _, held, _ = train.split_corpus()
    stream = train.token_stream(tokenizer(), held)
    return [w.tolist() for w in train.eval_windows(stream, length, n)]


class CachedModel:
    """One sequence through a shipped Llama with a KV cache, so a step computes only its new tokens.

    feed(ids) appends tokens and returns their logits [len(ids), V]; rollback(n) keeps the first n cached
    tokens (how rejected drafts leave the cache: their K/V are simply overwritten later). `seconds` adds up
    the wall time spent in feed()."""

    def __init__(self, model):
        a = model.args
        self.model, self.a, self.len, self.seconds = model, a, 0, 0.0
        shape = (a.num_hidden_layers, a.num_key_value_heads, a.max_position_embeddings, a.head_dim)
        self.k, self.v = torch.zeros(shape), torch.zeros(shape)

    def feed(self, ids: list[int]) -> torch.Tensor:
        t0 = time.perf_counter()
        logits = self._forward(ids)
        self.seconds += time.perf_counter() - t0
        return logits

    @torch.no_grad()
    def _forward(self, ids: list[int]) -> torch.Tensor:
        from reference_engine.tools import train

        a, m, n, start = self.a, self.model, len(ids), self.len
        if start + n > a.max_position_embeddings:
            raise ValueError(f"{start + n} tokens exceed the model's {a.max_position_embeddings} positions")
        cos, sin = train.rope_cos_sin(a, torch.arange(start, start + n))
        keys = torch.arange(start + n)
        mask = keys[None, :] <= torch.arange(start, start + n)[:, None]  # causal, offset by the cached tokens
        x = m.model.embed_tokens(torch.tensor([ids]))
        group = a.num_attention_heads // a.num_key_value_heads
        for i, layer in enumerate(m.model.layers):
            att, h = layer.self_attn, layer.input_layernorm(x)
            q = att.q_proj(h).view(1, n, a.num_attention_heads, a.head_dim).transpose(1, 2)
            k = att.k_proj(h).view(1, n, a.num_key_value_heads, a.head_dim).transpose(1, 2)
            v = att.v_proj(h).view(1, n, a.num_key_value_heads, a.head_dim).transpose(1, 2)
            q, k = train.apply_rope(q, cos, sin), train.apply_rope(k, cos, sin)
            self.k[i, :, start:start + n], self.v[i, :, start:start + n] = k[0], v[0]
            kk = self.k[i, :, :start + n].repeat_interleave(group, dim=0)[None]
            vv = self.v[i, :, :start + n].repeat_interleave(group, dim=0)[None]
            y = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
            x = x + att.o_proj(y.transpose(1, 2).reshape(1, n, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.len = start + n
        return m.lm_head(m.model.norm(x))[0]

    def rollback(self, n: int) -> None:
        self.len = min(self.len, n)


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.double() / temperature, dim=-1)


def generate(target, prompt: list[int], max_new_tokens: int, temperature: float = 0.0, seed: int = 0) -> dict:
    """Plain decoding with the KV cache: one target forward per token. Greedy at temperature 0.
    Returns {"tokens": new token ids, "target_forwards": forwards after the prompt's, "seconds": wall time,
    "decode_seconds": wall time after the prompt's forward, "forward_seconds": of it, time inside forwards}."""
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    cache, out = CachedModel(target), []
    logits = cache.feed(prompt)[-1]
    prefilled, prefill_s = time.perf_counter(), cache.seconds
    for _ in range(max_new_tokens):
        t = int(logits.argmax()) if temperature == 0 else int(torch.multinomial(_probs(logits, temperature), 1,
                                                                                 generator=gen))
        out.append(t)
        if len(out) < max_new_tokens:
            logits = cache.feed([t])[-1]
    end = time.perf_counter()
    return {"tokens": out, "target_forwards": len(out) - 1, "seconds": end - start, "decode_seconds": end - prefilled,
            "forward_seconds": cache.seconds - prefill_s}


def speculative_generate(target, draft, prompt: list[int], max_new_tokens: int, gamma: int,
                         temperature: float = 0.0, seed: int = 0, verifier=None, greedy_verifier=None) -> dict:
    """Speculative decoding of one sequence with KV caches: per step the draft proposes gamma tokens (one
    forward each; sampled at `temperature`, argmax at 0), the target scores gamma + 1 positions in one forward,
    and `verifier` (default: this module's verify; at temperature 0 `greedy_verifier`, default verify_greedy)
    decides what is emitted. Both caches then roll back to the accepted tokens; the draft feeds the one token it
    has not seen yet (the bonus, or its own last draft when all were accepted) in its next forward.

    Returns {"tokens": new token ids (max_new_tokens of them), "target_forwards", "draft_forwards" (after the
    prompt's), "accepted": drafts accepted per step, "seconds": wall time, "decode_seconds": wall time after the
    prompt's forwards, "target_seconds" / "draft_seconds": of it, time inside each model's forwards}."""
    verifier = verifier or verify
    greedy_verifier = greedy_verifier or verify_greedy
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    tc, dc = CachedModel(target), CachedModel(draft)
    ids = list(prompt)
    tc.feed(ids[:-1])
    dc.feed(ids[:-1])
    prefilled, prefill_t, prefill_d = time.perf_counter(), tc.seconds, dc.seconds
    out, accepted, draft_forwards = [], [], 0
    while len(out) < max_new_tokens:
        base = len(ids) - 1                       # tokens both caches hold; ids[-1] is not cached yet
        drafts, qs = [], []
        pending = ids[dc.len:]                    # what the draft has not seen (1 or 2 tokens)
        for _ in range(gamma):
            logits = dc.feed(pending)[-1]
            draft_forwards += 1
            if temperature == 0:
                x = int(logits.argmax())
            else:
                qs.append(_probs(logits, temperature))
                x = int(torch.multinomial(qs[-1], 1, generator=gen))
            drafts.append(x)
            pending = [x]
        logits = tc.feed([ids[-1]] + drafts)      # [gamma + 1, V]
        d = torch.tensor(drafts, dtype=torch.long)
        if temperature == 0:
            emitted = greedy_verifier(logits, d)
        else:
            emitted = verifier(_probs(logits, temperature), torch.stack(qs), d, gen)
        accepted.append(len(emitted) - 1)
        ids += emitted
        out += emitted
        tc.rollback(base + len(emitted))          # keep ids[-1] and the accepted drafts; ids[-1] is new
        dc.rollback(base + len(emitted))
    end = time.perf_counter()
    return {"tokens": out[:max_new_tokens], "target_forwards": len(accepted), "draft_forwards": draft_forwards,
            "accepted": accepted, "seconds": end - start, "decode_seconds": end - prefilled,
            "target_seconds": tc.seconds - prefill_t, "draft_seconds": dc.seconds - prefill_d}


@torch.no_grad()
def measure_acceptance(target, draft, contexts: list[list[int]], gamma: int = 8, temperature: float = 1.0,
                       seed: int = 0, verifier=None, greedy_verifier=None) -> dict:
    """One speculative step of gamma drafts from the end of each context (held-out text): the draft proposes,
    the target scores gamma + 1 positions, and the verifier decides (at temperature 0: verify_greedy).

    Returns {"accepted": per context, how many drafts were accepted (0 .. gamma);
             "expected": per context and draft position, acceptance_rate(p_i, q_i) (only meaningful while the
                         earlier drafts were accepted; exact at position 0)}.
    Because the verifier's draws come in draft order, a step with gamma' < gamma drafts on the same draws
    accepts min(accepted, gamma') of them: one run measures every gamma up to `gamma`."""
    verifier = verifier or verify
    greedy_verifier = greedy_verifier or verify_greedy
    gen = torch.Generator().manual_seed(seed)
    accepted, expected = [], []
    for ctx in contexts:
        dc, qs, drafts = CachedModel(draft), [], []
        logits = dc.feed(ctx)[-1]
        for i in range(gamma):
            if temperature == 0:
                x = int(logits.argmax())
                qs.append(torch.nn.functional.one_hot(torch.tensor(x), logits.shape[-1]).double())
            else:
                qs.append(_probs(logits, temperature))
                x = int(torch.multinomial(qs[-1], 1, generator=gen))
            drafts.append(x)
            if i < gamma - 1:
                logits = dc.feed([x])[-1]
        logits = target(torch.tensor([ctx + drafts]))[0, len(ctx) - 1:]   # [gamma + 1, V]
        d = torch.tensor(drafts, dtype=torch.long)
        if temperature == 0:
            emitted = greedy_verifier(logits, d)
            p = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
        else:
            p = _probs(logits, temperature)
            emitted = verifier(p, torch.stack(qs), d, gen)
        accepted.append(len(emitted) - 1)
        expected.append(acceptance_rate(p[:gamma], torch.stack(qs)).tolist())
    return {"accepted": accepted, "expected": expected}


@torch.no_grad()
def tree_logits(model, prefix: list[int], tokens: list[int], mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One forward of a shipped model over `prefix` (causal) and a tree of len(tokens) nodes (tokens[0], the root,
    is the token after the prefix), with the tree's attention mask [n, len(prefix) + n] and positions [n] (4.1's
    tree_attention_mask). Returns the logits of the n tree nodes [n, V]. No KV cache: the prefix is recomputed."""
    from reference_engine.tools import train

    a, m, P, n = model.args, model, len(prefix), len(tokens)
    full = torch.zeros(P + n, P + n, dtype=torch.bool)
    full[:P, :P] = torch.ones(P, P, dtype=torch.bool).tril()
    full[P:] = mask
    pos = torch.cat([torch.arange(P), positions.to(torch.long)])
    cos, sin = train.rope_cos_sin(a, pos)
    x = m.model.embed_tokens(torch.tensor([list(prefix) + list(tokens)]))
    group = a.num_attention_heads // a.num_key_value_heads
    for layer in m.model.layers:
        att, h = layer.self_attn, layer.input_layernorm(x)
        q = att.q_proj(h).view(1, P + n, a.num_attention_heads, a.head_dim).transpose(1, 2)
        k = att.k_proj(h).view(1, P + n, a.num_key_value_heads, a.head_dim).transpose(1, 2)
        v = att.v_proj(h).view(1, P + n, a.num_key_value_heads, a.head_dim).transpose(1, 2)
        q, k = train.apply_rope(q, cos, sin), train.apply_rope(k, cos, sin)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=full)
        x = x + att.o_proj(y.transpose(1, 2).reshape(1, P + n, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return m.lm_head(m.model.norm(x))[0, P:]


@torch.no_grad()
def draft_tree(draft, context: list[int], width: int, depth: int) -> tuple[list[int], list[int]]:
    """A greedy draft tree after `context` (its last token is the root): the draft's top-`width` tokens at the
    root, each continued by the draft's argmax for depth - 1 more tokens (width chains sharing the root, as
    Medusa's and SpecInfer's simplest trees). Returns (tokens, parents), width * depth + 1 nodes; width 1 is
    plain chain speculation of `depth` tokens."""
    tokens, parents = [context[-1]], [-1]
    top = draft(torch.tensor([context]))[0, -1].topk(width).indices.tolist()
    for t in top:
        seq, parent = list(context), 0
        for d in range(depth):
            if d:
                t = int(draft(torch.tensor([seq]))[0, -1].argmax())
            tokens.append(t)
            parents.append(parent)
            parent = len(tokens) - 1
            seq.append(t)
    return tokens, parents
