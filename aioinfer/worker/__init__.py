"""The model runner: one step's forward on the device, from the scheduler's grants to sampled tokens.

``model_runner.py`` turns a ``SchedulerOutput`` into a ``RunnerOutput``; ``input_buffers.py`` packs
the step's inputs into pinned memory; ``cuda_graphs.py`` captures and replays decode and small
prefill steps; ``kv_cache.py`` sizes and allocates the paged KV cache; ``swap.py`` (with
``swap_timer.py``) moves KV blocks to and from host memory. Sampling (sample/) and the grammar masks
(structured_output/) are rooms of their own below this one: the runner calls them, they never
import it.
"""
