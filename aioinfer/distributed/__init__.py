"""Tensor parallelism's collectives over torch.distributed: NCCL (CUDA) or gloo (CPU).

- group.py: the TPGroup (rank, size, device and control process groups) and its collectives;
- symm_all_reduce.py: the one-shot symmetric-memory all-reduce for small sums (CUDA, one host);
- lamport_all_reduce_norm.py: the all-reduce, residual add and RMSNorm of decode rows in one kernel;
- parallel_state.py: vLLM's ``cleanup_dist_env_and_memory``, for scripts that call it.

The split layers live in layers/linear.py and layers/embedding.py; the processes, the step channel
and the ranks' runners are the tensor-parallel executor's (executor/tensor_parallel.py).
"""
