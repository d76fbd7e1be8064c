"""Host KV pools over a CPU torch tensor for kvpool.sglang's tests.

SGLang's own MHATokenToKVPoolHost / MLATokenToKVPoolHost cannot be built here: their
constructors take device pools' buffer tables (MHABufferInfo with K/V pointer tables from a
device KV pool) and import SGLang's kernel packages (sglang.kernels, sgl-kernel), which the
--no-deps install leaves out. These classes expose exactly what KvpoolHiCacheStorage reads
(page_size, layout, dtype, layer_num, head_num, head_dim, kv_lora_rank, qk_rope_head_dim,
get_page_buffer_meta, get_data_page, get_dummy_flat_data_page), with get_page_buffer_meta's
pointer arithmetic copied from SGLang 0.5.23's pool_host/mha.py (page_first and layer_first)
and pool_host/mla.py (page_first: one buffer per page)."""

from __future__ import annotations

import torch


class MHAHostPool:
    """kv_buffer as SGLang lays it out: page_first (2, size, layers, heads, dim) or
    layer_first (2, layers, size, heads, dim)."""

    def __init__(self, pages=8, page_size=4, layers=3, heads=2, head_dim=8,
                 dtype=torch.bfloat16, layout="page_first"):
        self.page_size, self.layer_num, self.head_num, self.head_dim = (
            page_size, layers, heads, head_dim)
        self.dtype, self.layout = dtype, layout
        self.size = pages * page_size
        if layout == "page_first":
            shape = (2, self.size, layers, heads, head_dim)
        else:
            shape = (2, layers, self.size, heads, head_dim)
        self.kv_buffer = torch.zeros(shape, dtype=dtype)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        ptr_list = []
        base = self.kv_buffer.data_ptr()
        indices = indices.tolist()
        item = self.dtype.itemsize
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * item
        if self.layout == "layer_first":
            for index in range(0, len(indices), self.page_size):
                for layer_id in range(self.layer_num):
                    k_ptr = (base + indices[index] * self.head_num * self.head_dim * item
                             + layer_id * self.size * self.head_num * self.head_dim * item)
                    ptr_list += [k_ptr, k_ptr + v_offset]
            element_size = item * self.page_size * self.head_num * self.head_dim
        else:
            for index in range(0, len(indices), self.page_size):
                k_ptr = base + indices[index] * self.layer_num * self.head_num * self.head_dim * item
                ptr_list += [k_ptr, k_ptr + v_offset]
            element_size = self.layer_num * item * self.page_size * self.head_num * self.head_dim
        return ptr_list, [element_size] * len(ptr_list)

    def page(self, p):
        """The page's K and V (a copy), for comparisons."""
        s = slice(p * self.page_size, (p + 1) * self.page_size)
        if self.layout == "page_first":
            return self.kv_buffer[:, s].clone()
        return self.kv_buffer[:, :, s].clone()

    def indices(self, *pages):
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size)
                          for p in pages])

    def get_data_page(self, index, flat=True):
        s = slice(index, index + self.page_size)
        data = self.kv_buffer[:, s] if self.layout == "page_first" else self.kv_buffer[:, :, s]
        return data.flatten() if flat else data

    def get_dummy_flat_data_page(self):
        return torch.zeros(2 * self.layer_num * self.page_size * self.head_num * self.head_dim,
                           dtype=self.dtype)


class MLAHostPool:
    """MLA page_first: kv_buffer (size, layers, 1, kv_lora_rank + qk_rope_head_dim)."""

    def __init__(self, pages=8, page_size=4, layers=3, kv_lora_rank=16, qk_rope_head_dim=8,
                 dtype=torch.bfloat16):
        self.page_size, self.layer_num = page_size, layers
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.dtype, self.layout = dtype, "page_first"
        self.size = pages * page_size
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        self.kv_buffer = torch.zeros((self.size, layers, 1, self.kv_cache_dim), dtype=dtype)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        base = self.kv_buffer.data_ptr()
        indices = indices.tolist()
        item = self.dtype.itemsize
        ptr_list = [base + indices[i] * self.layer_num * self.kv_cache_dim * item
                    for i in range(0, len(indices), self.page_size)]
        element_size = self.layer_num * item * self.page_size * self.kv_cache_dim
        return ptr_list, [element_size] * len(ptr_list)

    def page(self, p):
        return self.kv_buffer[p * self.page_size:(p + 1) * self.page_size].clone()

    def indices(self, *pages):
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size)
                          for p in pages])
