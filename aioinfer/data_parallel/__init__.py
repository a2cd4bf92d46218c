"""Data parallelism in one process: whole-model ``Engine`` replicas, one per device, behind one
router (docs/data_parallel.md). Tensor parallelism, one process per rank, is ``aioinfer.distributed``."""
