# Run in call 5 with AIOINFER_GRAMMAR_CPUS, a knob tried for that call and removed after it (no gain).
"""structured_output_rounds with the engine (main) thread pinned to ENGINE_CPUS once the LLM exists."""
import os
from benchmarks import structured_output_rounds as rounds
from aioinfer.worker.grammar_mask import _cpu_list

orig = rounds.make_llm
def make_llm(*a, **k):
    out = orig(*a, **k)
    cpus = os.environ.get("ENGINE_CPUS")
    if cpus:
        os.sched_setaffinity(0, _cpu_list(cpus))
        print("engine thread pinned to", sorted(os.sched_getaffinity(0)), flush=True)
    return out
rounds.make_llm = make_llm
if __name__ == "__main__":
    rounds.main()
