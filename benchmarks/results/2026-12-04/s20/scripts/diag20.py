"""Twentieth session: diag19.py's variants and counters on the tree where the masks of steps ahead are
copied to device rows (the default again since the nineteenth session), plus ``host_rows`` (the slots
made again with ``read_host_rows=True``: the apply reads the pinned host rows, its launcher given their
address as an integer, utils/triton_launch.py ``DeviceAddress``) and ``host_rows_tensor`` (the same rows
given as tensors: the launcher asks the driver for their address every launch, the eighteenth
session's landed form); ``deferral_only`` (prepared for the next session, not run: diag19.py's
``no_grammar_work`` without the masks' copy, StepMask and apply either, so that only the deferred
sampling's structure is left: with ``no_grammar_work`` beside it, it splits the path's cost between
the copy + apply and the deferral itself); ``lean_apply`` (prepared, not run: the apply's kept
compiled kernel called through its C launcher with the arguments bound once per shape, none of the
Python between (CompiledLaunch's key, Triton's runner and launcher wrappers): what a leaner launch
would give the constrained step; its engine-thread CPU in the ``lean_apply`` counter)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../s19/scripts"))
import diag19  # noqa: E402,F401  (registers its variants, diag18's and the earlier ones)
import diag18  # noqa: E402  (on the path diag19 put it on)

from aioinfer.worker.mask_slots import MaskSlots  # noqa: E402
from benchmarks import structured_output_rounds as rounds  # noqa: E402


def _host_rows(with_address):
    def variant(engine):
        masks = engine.runner.grammar_masks
        saved = masks._slots  # made by the warm-up runs (copying to device rows)
        slots = MaskSlots(masks.num_words, masks.device, saved.rows, read_host_rows=True)
        assert slots.reads_host_rows and not saved.reads_host_rows
        if not with_address:
            for slot in slots._slots:
                slot.address = None
            grow = slots._make

            def make(rows):
                grow(rows)
                for slot in slots._slots:
                    slot.address = None
            slots._make = make
        masks._slots = slots

        def undo():
            masks._slots.close()
            masks._slots = saved
        return undo
    return variant


def deferral_only(engine):
    masks = engine.runner.grammar_masks
    undo_work = diag19.no_grammar_work(engine)
    masks.poll = lambda pending: True  # every token allowed: nothing to copy or apply
    masks.finish_fill = lambda pending: None

    def undo():
        del masks.poll, masks.finish_fill
        undo_work()
    return undo


_LEAN_SECONDS = [0.0]
rounds.COUNTERS["lean_apply"] = lambda: _LEAN_SECONDS[0]


def lean_apply(engine):
    import time

    import torch
    from triton import knobs

    from aioinfer.utils import triton_launch
    from aioinfer.worker import bitmask_apply
    masks = engine.runner.grammar_masks
    kernel = bitmask_apply._get_kernel()
    block = 2048
    bound = {}  # shape and alignment key -> the C launcher's bound parts, or False (the usual path)
    raw_stream = torch._C._cuda_getCurrentRawStream
    clock = time.thread_time

    def apply(logits, mask):
        started = clock()
        bits, rows = mask.bits, mask.rows
        num_masks, vocab = bits.shape[0], logits.shape[1]
        index = rows if rows is not None else bits
        key = (logits.dtype, vocab, logits.stride(0), bits.shape[1], rows is not None, logits.data_ptr() % 16 == 0,
               bits.data_ptr() % 16 == 0, index.data_ptr() % 16 == 0)
        entry = bound.get(key)
        if entry is None or entry is False or not num_masks or not bits.is_contiguous():
            bitmask_apply.apply_bitmask(logits, bits, rows)  # compiles and keeps the kernel on a key's first use
            if entry is None and num_masks and bits.is_contiguous():
                args = (logits, bits, index, vocab, logits.stride(0), bits.shape[1], rows is not None, block)
                compiled = kernel._compiled.get((kernel._driver.active.get_current_device(),)
                                                + tuple(map(triton_launch._key_of, args)))
                if compiled is not None:
                    run = compiled.run
                    usable = (not run.global_scratch_size and not run.profile_scratch_size
                              and knobs.runtime.launch_enter_hook is None and knobs.runtime.launch_exit_hook is None)
                    bound[key] = ((run.launch, compiled.function, run.launch_cooperative_grid, run.launch_pdl,
                                   compiled.packed_metadata, logits.device.index) if usable else False)
        else:
            launch, function, cooperative, pdl, packed, device = entry
            launch(num_masks, (vocab + block - 1) // block, 1, raw_stream(device), function, cooperative, pdl, None, None,
                   packed, None, None, None, logits, bits, index, vocab, logits.stride(0), bits.shape[1], rows is not None,
                   block)
        _LEAN_SECONDS[0] += clock() - started
        return logits
    masks.apply = apply

    def undo():
        del masks.apply
    return undo


rounds.VARIANTS.update(host_rows=_host_rows(True), host_rows_tensor=_host_rows(False), deferral_only=deferral_only,
                       lean_apply=lean_apply)

if __name__ == "__main__":
    if "--phases" in sys.argv:
        sys.argv.remove("--phases")
        diag18.phases()
    rounds.main()
