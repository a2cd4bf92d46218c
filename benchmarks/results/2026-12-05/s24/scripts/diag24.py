"""Twenty-fourth session: the fused masked greedy (worker/masked_greedy.py) and the free step's
argmax on the raw logits (``Sampler.argmax_raw_logits``) are on by default; ``three_launches``
turns the fused kernel off for its runs (the apply, the float copy and the argmax, as before the
session), so the landed tree is measured beside the old constrained path in one engine."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../s23/scripts"))
import diag23  # noqa: E402,F401  (registers its variants and the earlier ones)

from aioinfer.worker.masked_greedy import MaskedGreedy  # noqa: E402
from benchmarks import structured_output_rounds as rounds  # noqa: E402


def three_launches(engine):
    MaskedGreedy.enabled = False

    def undo():
        MaskedGreedy.enabled = True
    return undo


rounds.VARIANTS.update(three_launches=three_launches)

if __name__ == "__main__":
    rounds.main()
