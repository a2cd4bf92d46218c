"""Twenty-third session (prepared; no device was lent): diag20.py's variants and counters, plus
``masked_greedy``: a constrained greedy step sampled by the fused kernel (worker/masked_greedy.py:
each row's argmax over the tokens its mask allows, one launch) instead of the apply, the sampler's
float copy and its argmax (three). The landed tree keeps the three (``MaskedGreedy.enabled`` is
False) until this measures the one against them. ``--argmax-raw`` turns on the free side's twin for
the whole engine, free runs and constrained alike (``Sampler.argmax_raw_logits``: a plain greedy
step's argmax on the bf16 logits, without their float32 copy), so that the fused kernel is compared
with a free step that also drops what it can."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../2026-12-04/s20/scripts"))
import diag20  # noqa: E402,F401  (registers its variants and the earlier ones)
import diag18  # noqa: E402  (on the path diag19 put it on)

from aioinfer.worker.masked_greedy import MaskedGreedy  # noqa: E402
from aioinfer.worker.sampler import Sampler  # noqa: E402
from benchmarks import structured_output_rounds as rounds  # noqa: E402


def masked_greedy(engine):
    MaskedGreedy.enabled = True

    def undo():
        MaskedGreedy.enabled = False
    return undo


rounds.VARIANTS.update(masked_greedy=masked_greedy)

if __name__ == "__main__":
    if "--argmax-raw" in sys.argv:
        sys.argv.remove("--argmax-raw")
        Sampler.argmax_raw_logits = True
    if "--phases" in sys.argv:
        sys.argv.remove("--phases")
        diag18.phases()
    rounds.main()
