"""A/B variants for call 3: the masks' copy at finish on the compute stream (before)."""
from benchmarks import structured_output_rounds as rounds
from aioinfer.worker.grammar_mask import GrammarMasks

def copy_at_finish(engine):
    new = GrammarMasks._copy_to_device
    GrammarMasks._copy_to_device = lambda self, pending: None
    def undo():
        GrammarMasks._copy_to_device = new
    return undo

rounds.VARIANTS["copy_at_finish"] = copy_at_finish
if __name__ == "__main__":
    rounds.main()
