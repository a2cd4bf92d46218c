"""Attention over the paged KV cache: the backends (Triton paged kernels, flash-attn when installed,
torch for the CPU and for reference), chosen per device, behind one interface the layers call with
the step's metadata (block tables, sequence lengths), so that no layer knows how KV is laid out."""
