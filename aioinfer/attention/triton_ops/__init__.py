"""Triton kernels for paged attention. Importing this package imports triton: only the triton
backend (and tests / benchmarks that asked for it) may do so, never a CPU code path."""
