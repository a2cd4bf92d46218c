"""Structured outputs: constrain a request's tokens to a JSON schema, a regex, a choice or a grammar.

``params.py`` is the user's request (vLLM's ``StructuredOutputsParams``); ``compiler.py`` turns it
into a grammar matcher through llguidance (docs/structured_outputs.md says why that library), with
a cache by grammar, on the threads of ``compile_threads.py`` (a large stack, a low priority, a time
budget) after the bounds of ``limits.py``; the model runner fills each step's token bitmask from the
matchers and applies it to the logits before sampling (worker/grammar_mask.py), and advances them
by the sampled tokens.
"""

from aioinfer.structured_output.params import InvalidGrammarError, StructuredOutputsParams

__all__ = ["InvalidGrammarError", "StructuredOutputsParams"]
