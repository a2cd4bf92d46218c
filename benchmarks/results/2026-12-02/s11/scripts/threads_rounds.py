"""Call 1 variants: llguidance's executor with 4 or 8 threads instead of the default (12 of 16 cores)."""
import llguidance

from benchmarks import structured_output_rounds as rounds


def executor_of(threads):
    def patch(engine):
        masks = engine.runner.grammar_masks
        saved = masks._executor
        masks._executor = llguidance.LLExecutor(threads)

        def undo():
            masks._executor = saved
        return undo
    return patch


for n in (2, 4, 8):
    rounds.VARIANTS[f"threads{n}"] = executor_of(n)

if __name__ == "__main__":
    rounds.main()
