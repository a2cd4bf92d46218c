"""Nineteenth session: diag18.py's variants and counters, plus the GIL turns' handling:
``switch_1us``, ``switch_5us``, ``switch_20us`` / ``switch_default`` (the switch interval while a grammar
job runs: 1, 5 or 20 µs, or left at the interpreter's 5 ms, instead of grammar_worker.py's 50 µs) and ``inline`` (no worker: the engine
thread advances the matchers and computes the masks itself, in llguidance's threads without the
GIL, as soon as the tokens are collected: no turn at all, the grammar's whole wall time on the
engine thread); ``handshake`` (``submit`` waits, without the GIL, until the worker has taken the job:
its first GIL moment a step is no forced switch) and ``handshake_5us`` (both); ``no_grammar_work``
(the path with a grammar engine that costs nothing: the bound for any placement of the grammar). ``engine_consume`` (diag18.py) takes one turn of three away."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../s18/scripts"))
import diag18  # noqa: E402  (registers its variants and diag17's, diag16's and diag's)

from benchmarks import structured_output_rounds as rounds  # noqa: E402


def _switch(seconds):
    def variant(engine):
        from aioinfer.worker.grammar_worker import HANDOFF
        saved = HANDOFF.seconds
        HANDOFF.seconds = seconds

        def undo():
            HANDOFF.seconds = saved
        return undo
    return variant


def inline(engine):
    from aioinfer.worker.grammar_worker import MaskJob
    masks = engine.runner.grammar_masks

    def start(pending, live=()):
        masks._consume(list(live))
        if pending is None:
            return
        masks._compute(pending)
        job = MaskJob((), (), (), 0, 0, 0)
        job.done.release()
        pending.job = job
    masks.start = start

    def undo():
        del masks.start
    return undo


class _HandshakeWorker:
    """grammar_worker.GrammarWorker whose ``submit`` waits (without the GIL) until the thread has
    taken the job and is about to call llguidance: the thread's first GIL moment a step comes while
    the engine thread waits for it, not as a forced switch in the middle of its Python."""

    def __init__(self, threads, cpus, handoff):
        import queue
        import threading
        self._jobs = queue.SimpleQueue()
        self._handoff = handoff
        ready, made = threading.Event(), []
        threading.Thread(target=_serve_handshake, args=(self._jobs, threads, cpus, handoff, ready, made),
                         name="aioinfer-grammar-hs", daemon=True).start()
        ready.wait()
        self.executor = made[0]

    def submit(self, job):
        import threading
        self._handoff.enter()
        taken = threading.Lock()
        taken.acquire()
        self._jobs.put((job, taken))
        taken.acquire()

    def close(self):
        self._jobs.put(None)


def _serve_handshake(jobs, threads, cpus, handoff, ready, made):
    import time
    import llguidance
    if cpus:
        os.sched_setaffinity(0, cpus)
    executor = llguidance.LLExecutor(threads)
    made.append(executor)
    ready.set()
    clock = time.perf_counter
    while (item := jobs.get()) is not None:
        job, taken = item
        job.started = clock()
        taken.release()
        try:
            if job.live:
                accepted = executor.consume_token_par(job.live)
                if not all(accepted):
                    job.rejected = accepted
            if job.plain:
                executor.unsafe_compute_mask_ptr(job.plain, job.ptr, job.row_bytes, job.num_rows)
            if job.with_drafts:
                executor.unsafe_compute_mask_ptr_with_draft_token(job.with_drafts, job.ptr, job.row_bytes, job.num_rows)
        except BaseException as error:
            job.error = error
        finally:
            handoff.exit()
            job.finished = clock()
            job.done.release()


def handshake(engine):
    from aioinfer.worker.grammar_worker import HANDOFF
    masks = engine.runner.grammar_masks
    saved = masks._grammar_worker()
    from aioinfer.worker.grammar_mask import default_grammar_threads
    masks._worker = _HandshakeWorker(default_grammar_threads(masks._cpus), masks._cpus, HANDOFF)

    def undo():
        masks._worker.close()
        masks._worker = saved
    return undo


def handshake_5us(engine):
    undo_switch = _switch(5e-6)(engine)
    undo_handshake = handshake(engine)

    def undo():
        undo_handshake()
        undo_switch()
    return undo


def no_grammar_work(engine):
    """The constrained path with a grammar engine that costs nothing and takes no GIL: the masks
    allow every token (the slots' rows set to -1 once), the matchers are never advanced, and each
    job is done as it is submitted. Every other part of the path (plan, slots, polls, finish, the
    apply's launch and read, sampling after the masks) runs as landed: the bound on what any
    placement of the grammar work (a helper process writing the rows, say) could give."""
    import torch

    from aioinfer.worker.grammar_worker import MaskJob
    masks = engine.runner.grammar_masks
    filled = set()

    def start(pending, live=()):
        if pending is None:
            return
        with torch.inference_mode():  # the slots' rows are inference tensors
            if pending.slot is None:
                pending.host.fill_(-1)
            elif id(pending.slot.host) not in filled:
                pending.slot.host.fill_(-1)
                filled.add(id(pending.slot.host))
        job = MaskJob((), (), (), 0, 0, 0)
        job.done.release()
        pending.job = job
    masks.start = start
    masks.advance = lambda live: None

    def undo():
        del masks.start, masks.advance
    return undo


rounds.VARIANTS.update(no_grammar_work=no_grammar_work, handshake=handshake, handshake_5us=handshake_5us, switch_1us=_switch(1e-6), switch_5us=_switch(5e-6), switch_20us=_switch(20e-6),
                       switch_default=_switch(5e-3), inline=inline)

if __name__ == "__main__":
    if "--phases" in sys.argv:
        sys.argv.remove("--phases")
        diag18.phases()
    rounds.main()
