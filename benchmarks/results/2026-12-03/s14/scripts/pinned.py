"""Fourteenth session: the engine thread pinned to one CPU (the ``host_cpu`` option's form), for the
free and the constrained runs alike, with llguidance's threads on every CPU (``constrained``: what
the landed tree gives a pinned engine) or on every CPU but the engine's core (``apart``, ``apart_8``).

    ENGINE_CPU=N python3 pinned.py --tokenizer DIR [structured_output_rounds options]
"""
import glob
import os

from benchmarks import structured_output_rounds as rounds

ENGINE_CPU = int(os.environ.get("ENGINE_CPU", "2"))


def siblings(cpu: int) -> set[int]:
    path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    cpus = set()
    for part in open(path).read().strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def topology() -> None:
    cores = {}
    for path in sorted(glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list")):
        cores.setdefault(open(path).read().strip(), None)
    print("cores (thread siblings):", list(cores), "allowed:", sorted(os.sched_getaffinity(0)), flush=True)


real_make_llm = rounds.make_llm


def make_llm_then_pin(*args, **kwargs):
    made = real_make_llm(*args, **kwargs)
    os.sched_setaffinity(0, {ENGINE_CPU})  # this (the engine's) thread only; built with every CPU
    print("engine thread pinned to", ENGINE_CPU, flush=True)
    return made


rounds.make_llm = make_llm_then_pin


def apart(threads=None):
    def variant(engine):
        masks = engine.runner.grammar_masks
        saved_cpus, saved_env = masks._cpus, os.environ.get("AIOINFER_GRAMMAR_THREADS")
        masks.close()
        masks._cpus = set(saved_cpus) - siblings(ENGINE_CPU)
        if threads:
            os.environ["AIOINFER_GRAMMAR_THREADS"] = str(threads)

        def undo():
            masks.close()
            masks._cpus = saved_cpus
            if saved_env is None:
                os.environ.pop("AIOINFER_GRAMMAR_THREADS", None)
            else:
                os.environ["AIOINFER_GRAMMAR_THREADS"] = saved_env
        return undo
    return variant


rounds.VARIANTS.update(apart=apart(), apart_8=apart(8))

if __name__ == "__main__":
    topology()
    rounds.main()
