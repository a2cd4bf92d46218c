"""Where each data-parallel replica runs: one device per replica, consecutive GPUs.

Replica ``i`` of ``data_parallel_size`` replicas, each ``tensor_parallel_size`` GPUs wide, gets
``cuda:{base + i * tensor_parallel_size}`` as its device (its tensor-parallel ranks take the GPUs
after it); ``base`` is the index in ``device`` ("cuda:2" -> 2; "cuda" and "auto" -> 0). On CPU every
replica runs on "cpu" (tests and smoke runs: the replicas then share the cores).
"""

from __future__ import annotations


def replica_devices(device: str, data_parallel_size: int, tensor_parallel_size: int,
                    cuda_device_count: int) -> list[str]:
    """Device names of the replicas; ValueError when there are not enough GPUs."""
    if device == "auto":
        device = "cuda" if cuda_device_count > 0 else "cpu"
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return ["cpu"] * data_parallel_size
    if kind != "cuda":
        if data_parallel_size > 1:
            raise ValueError(f"data parallelism runs on cuda or cpu devices, got {device!r}")
        return [device]
    if index and not index.isdigit():
        raise ValueError(f"bad device {device!r}")
    base = int(index) if index else 0
    needed = base + data_parallel_size * tensor_parallel_size
    if needed > cuda_device_count:
        raise ValueError(
            f"data_parallel_size {data_parallel_size} x tensor_parallel_size {tensor_parallel_size} from "
            f"cuda:{base} needs GPUs cuda:{base}..cuda:{needed - 1}, but {cuda_device_count} are visible")
    return [f"cuda:{base + i * tensor_parallel_size}" for i in range(data_parallel_size)]
