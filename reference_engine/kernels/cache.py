"""Writing new K/V into the paged cache."""
import torch


def write_kv_torch(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """k, v: [num_tokens, kv_heads, head_dim]; slot_mapping: [num_tokens] (slot = block_id * block_size + offset).

    A flat view of the cache turns the scatter into one index_copy_ per tensor.
    """
    kv_heads, head_dim = k_cache.shape[-2:]
    if k.dtype != k_cache.dtype:
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)
