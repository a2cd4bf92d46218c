"""Text in and out: loading the tokenizer, incremental detokenization, stop strings, and a
request's output text built from both (``TextAccumulator``). Used by the sync core's input and
output processors; knows nothing of engines."""
