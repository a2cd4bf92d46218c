"""The executor layer, between EngineCore and the model runner(s): what runs one engine's model.

- abstract.py: the ``Executor`` interface EngineCore drives (launch / collect a step, the KV block
  counts, grammar failures, swap timings, shutdown);
- factory.py: ``create_executor``, the local or the tensor-parallel one, from the config;
- local.py: one ModelRunner in this process;
- tensor_parallel.py: rank 0 of a tensor-parallel group, which spawns and drives the other ranks;
- tp_worker.py: the process of a rank > 0, replaying rank 0's steps (``python -m aioinfer.executor.tp_worker``
  for ranks on other machines); tp_processes.py: rank 0's handles on those processes;
- step_channel.py: rank 0's per-step message to the other ranks;
- model_setup.py: loading the model (weights, tokenizer, limits, device, dtype, CPU threads);
- runner_setup.py: the KV cache spec and block count, the ModelRunner, what the ranks agree on.

The collectives the split layers use (process groups, all-reduce kernels) stay in distributed/,
below the layers.
"""
