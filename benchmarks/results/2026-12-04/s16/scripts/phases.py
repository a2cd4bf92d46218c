"""Sixteenth session, a probe: structured_output_phases with more phases (outputs, metrics, inputs)
and the step's sync timed as a blocking event (so CPU figures are work, not a spin)."""
import sys
import time

import torch

from aioinfer.engine.output_processor import OutputProcessor
from aioinfer.entrypoints.llm_metrics import OfflineMetrics
from aioinfer.worker import model_runner
from aioinfer.worker.input_buffers import InputBuffers
from aioinfer.worker.sampler import Sampler
from benchmarks import structured_output_phases as phases

landed_copy_to_host = model_runner._copy_to_host


class TimedEvent:
    __slots__ = ("event",)

    def __init__(self, event):
        self.event = event

    def synchronize(self):
        self.event.synchronize()


def copy_to_host(result):
    copied, ready = landed_copy_to_host(result)
    if ready is None:
        return copied, None
    ready = torch.cuda.Event(blocking=True)
    ready.record()
    return copied, TimedEvent(ready)


model_runner._copy_to_host = copy_to_host
phases.PHASES += [(OutputProcessor, "process"), (OfflineMetrics, "record_step"), (InputBuffers, "prepare"),
                  (TimedEvent, "synchronize"), (Sampler, "__call__"), (model_runner.ModelRunner, "_fill_placeholders")]
try:
    from aioinfer.worker.cuda_graphs import CudaGraphRunner
    phases.PHASES.append((CudaGraphRunner, "run"))
except ImportError:
    pass

if __name__ == "__main__":
    phases.main()
