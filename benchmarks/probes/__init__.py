"""Diagnostics and one-off probes (benchmarks/probes/README.md): run as ``python -m benchmarks.probes.NAME``."""
