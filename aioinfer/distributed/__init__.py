"""Tensor parallelism over torch.distributed: one process per rank, NCCL (CUDA) or gloo (CPU).

- group.py: the TPGroup (rank, size, device and control process groups) and its collectives;
- rank_setup.py: what every rank does alike (check the split, load the shard, size the KV cache);
- worker.py: the process of a rank > 0, replaying rank 0's steps;
- processes.py: rank 0's handles on the spawned worker processes;
- tp_runner.py: rank 0's runner, which EngineCore uses when tensor_parallel_size > 1.

The split layers themselves live in layers/linear.py and layers/embedding.py.
"""
