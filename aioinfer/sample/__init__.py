"""Sampling: one step's logits to tokens, and the logprobs a request asked for.

``sampling_metadata.py`` turns the step's rows (each request's ``SamplingParams``, seed and tokens so
far) into device tensors once per step; ``sampler.py`` runs the logit processors of ``penalties.py``
(logit_bias, min_tokens, the three penalties) and takes the greedy argmax or a seeded random draw
with the counter-based noise of ``seeded_noise.py``; ``logprobs.py`` scores the raw distribution;
``prompt_logprobs.py`` scores prompt positions chunk by chunk in bounded memory.

A room of its own, apart from the model runner, because none of it knows the model, the KV cache or
CUDA graphs: it takes logits (for prompt logprobs, hidden states and the LM head) and per-row records,
and gives tokens and logprob rows. The model runner (worker/) calls it; the grammar-mask runtime
(structured_output/) sets disallowed logits to -inf before it and reuses its records and its plain
greedy test, so structured_output imports sample, never the reverse. Nothing is imported here, so
importing one module does not load the others.
"""
