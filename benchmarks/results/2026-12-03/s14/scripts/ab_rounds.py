"""Fourteenth session: a deferred step sampled as soon as its masks are computed (this tree) against
sampled just before the next launch (``late_sample``: the landed 792d7d5), and llguidance's thread
count, in one engine, by benchmarks/structured_output_rounds.py's alternating rounds."""
import os

from benchmarks import structured_output_rounds as rounds


def late_sample(engine):  # the copy still started by polls, but the step sampled only before the next launch
    runner = engine.runner
    masks = runner.grammar_masks

    def poll_masks(launched):
        if launched.logits is not None:
            masks.poll(launched.pending_mask)
        return False
    runner.poll_masks = poll_masks

    def undo():
        del runner.poll_masks
    return undo


def threads(n):
    def variant(engine):  # the worker (and llguidance's pool) made again with n threads
        masks = engine.runner.grammar_masks
        saved = os.environ.get("AIOINFER_GRAMMAR_THREADS")
        masks.close()
        os.environ["AIOINFER_GRAMMAR_THREADS"] = str(n)

        def undo():
            masks.close()
            if saved is None:
                del os.environ["AIOINFER_GRAMMAR_THREADS"]
            else:
                os.environ["AIOINFER_GRAMMAR_THREADS"] = saved
        return undo
    return variant


def both(first, second):
    def variant(engine):
        undo_first, undo_second = first(engine), second(engine)

        def undo():
            undo_second()
            undo_first()
        return undo
    return variant


rounds.VARIANTS.update(late_sample=late_sample, threads_4=threads(4), threads_8=threads(8),
                       late_threads_8=both(late_sample, threads(8)))

if __name__ == "__main__":
    rounds.main()
