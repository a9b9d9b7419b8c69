"""How one model is split across tensor-parallel ranks (Megatron-style, as vLLM shards Llama), and the one
collective the forward needs.

Per layer, with tp ranks:
- qkv_proj and gate_up_proj are column-parallel: rank r holds the output rows of its query heads, its KV
  heads and its slice of the intermediate size, so each rank computes its own heads' attention with no
  communication.
- o_proj and down_proj are row-parallel: rank r holds the input columns matching those heads / that slice,
  so each rank's output is a partial sum over its columns; an all-reduce adds them (2 per layer). Their
  biases are added once, by rank 0.
- KV heads are split tp ways when tp divides them; when tp exceeds them, each rank holds one whole KV head
  and tp / kv_heads ranks hold the same one (a KV head cannot be split: its head_dim belongs to one
  attention). Lesson 06's per-GPU KV formula is exactly this.
- Embedding, final norm and lm_head are replicated (the shipped models are tiny; vLLM splits the vocab).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ShardSpec:
    """Rank `rank` of `size`. Head and intermediate ranges are [start, stop) in the full model's numbering."""

    rank: int = 0
    size: int = 1

    def check(self, num_heads: int, num_kv_heads: int, intermediate: int) -> None:
        """Raises ValueError unless the model splits this many ways."""
        if not isinstance(self.size, int) or self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"bad shard: rank {self.rank!r} of tensor_parallel_size {self.size!r}")
        for name, n in (("num_attention_heads", num_heads), ("intermediate_size", intermediate)):
            if n % self.size:
                raise ValueError(f"{name}={n} does not split across tensor_parallel_size={self.size}")
        if num_kv_heads % self.size and self.size % num_kv_heads:
            raise ValueError(f"num_key_value_heads={num_kv_heads} and tensor_parallel_size={self.size}: one must divide "
                             "the other (KV heads are split, or each replicated on size / kv_heads ranks)")

    def heads(self, num_heads: int) -> range:
        n = num_heads // self.size
        return range(self.rank * n, (self.rank + 1) * n)

    def kv_heads(self, num_kv_heads: int) -> range:
        """This rank's KV heads: a split when size <= kv_heads, else the one head its query heads use."""
        if self.size <= num_kv_heads:
            n = num_kv_heads // self.size
            return range(self.rank * n, (self.rank + 1) * n)
        h = self.rank // (self.size // num_kv_heads)
        return range(h, h + 1)

    def intermediate(self, size: int) -> range:
        n = size // self.size
        return range(self.rank * n, (self.rank + 1) * n)

    def kv_replicas(self, num_kv_heads: int) -> int:
        """How many ranks hold each KV head (1 when they are split)."""
        return max(1, self.size // num_kv_heads)


def all_reduce(x: torch.Tensor, shard: ShardSpec) -> torch.Tensor:
    """Sum x over the ranks, in place (the default process group holds exactly the tp ranks of one engine)."""
    if shard.size > 1:
        dist.all_reduce(x)
    return x


NO_SHARD = ShardSpec()  # the whole model on one rank
