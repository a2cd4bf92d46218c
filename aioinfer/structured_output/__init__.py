"""Structured outputs: constrain a request's tokens to a JSON schema, a regex, a choice or a grammar.

The whole feature, from the request's parameters to the masks on the device:

- ``params.py`` is the user's request (vLLM's ``StructuredOutputsParams``); ``compiler.py`` turns it
  into a grammar matcher through llguidance (docs/structured_outputs.md says why that library), with
  a cache by grammar, on the threads of ``compile_threads.py`` (a large stack, a low priority, a time
  budget) after the bounds of ``limits.py`` (``closed_objects.py``: undeclared properties forbidden;
  ``llg_tokenizer.py``: the tokenizer as llguidance sees it).
- On the device side the model runner holds a ``GrammarMasks`` (``grammar_mask.py``): each step it
  fills the constrained rows' token bitmasks from the matchers (on the thread of
  ``grammar_worker.py`` when steps are launched ahead, into the pinned and device rows of
  ``mask_slots.py``), applies them to the logits before sampling (``bitmask_apply.py``, or for a
  plain greedy step the fused argmax of ``masked_greedy.py``), and advances the matchers by the
  sampled tokens.

The device-side modules import sample/ (the per-row sampling records, ``host_to_device`` and the
plain-greedy test), never worker/: the runner imports them. Only ``params`` is imported here, because
``sampling_params.py`` imports it on every path; the rest (torch, llguidance) loads when used.
"""

from aioinfer.structured_output.params import InvalidGrammarError, StructuredOutputsParams

__all__ = ["InvalidGrammarError", "StructuredOutputsParams"]
