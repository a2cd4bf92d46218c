"""The synchronous core: ``EngineCore`` (one scheduler + runner step), model setup, input and output
processing, and the ``GenerationDelta`` that the offline ``LLM`` and the async ``Engine`` both hand out."""
