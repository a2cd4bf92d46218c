"""Speculative decoding: n-gram (prompt lookup) drafts verified in the ordinary step.

``ngram.py`` proposes drafts from a request's own tokens; ``policy.py`` decides who drafts and when
(greedy requests only, off above a batch size, backing off where drafts were rejected). The
scheduler grants drafts as extra tokens of a decode step and rolls the computed count back by the
rejected ones (core/scheduler.py); the model runner verifies them in the step's one forward
(worker/model_runner.py: accept while draft == argmax).
"""
