"""The memory layout the Triton kernels need, checked before a launch (no triton import: usable anywhere)."""


def check_layout(**tensors) -> None:
    """The layout every kernel here needs: each tensor's last dimension contiguous (stride 1), since the kernels
    add head_dim (or block-table) offsets to pointers directly. Other strides, K's and V's each their own, are
    passed to the kernels, so views and caches of different layouts are fine. Raises ValueError naming the tensor."""
    expected = {"block_tables": "[num_seqs, max_blocks]", "q": "[tokens, heads, head_dim]",
                "k": "[tokens, kv_heads, head_dim]", "v": "[tokens, kv_heads, head_dim]",
                "k_cache": "[num_blocks, block_size, kv_heads, head_dim]",
                "v_cache": "[num_blocks, block_size, kv_heads, head_dim]"}
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{name} {expected.get(name, '')} needs a contiguous last dimension (stride 1), got shape "
                             f"{tuple(t.shape)} with strides {t.stride()}: the kernels step through it one element at "
                             f"a time. {name}.contiguous() gives such a copy (for a cache the kernels write into, "
                             "allocate it with that dimension innermost instead, or the writes land in the copy)")
    k_cache, v_cache = tensors.get("k_cache"), tensors.get("v_cache")
    if k_cache is not None and v_cache is not None and k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape [num_blocks, block_size, kv_heads, head_dim], "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
