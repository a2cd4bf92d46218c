"""Twentieth session: diag19.py's variants and counters on the tree where the masks of steps ahead are
copied to device rows (the default again since the nineteenth session), plus ``host_rows`` (the slots
made again with ``read_host_rows=True``: the apply reads the pinned host rows, its launcher given their
address as an integer, utils/triton_launch.py ``DeviceAddress``) and ``host_rows_tensor`` (the same rows
given as tensors: the launcher asks the driver for their address every launch, the eighteenth
session's landed form); ``deferral_only`` (prepared for the next session, not run: diag19.py's
``no_grammar_work`` without the masks' copy, StepMask and apply either, so that only the deferred
sampling's structure is left: with ``no_grammar_work`` beside it, it splits the path's cost between
the copy + apply and the deferral itself)."""
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


rounds.VARIANTS.update(host_rows=_host_rows(True), host_rows_tensor=_host_rows(False), deferral_only=deferral_only)

if __name__ == "__main__":
    if "--phases" in sys.argv:
        sys.argv.remove("--phases")
        diag18.phases()
    rounds.main()
