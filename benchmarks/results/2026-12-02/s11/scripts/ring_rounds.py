"""Calls 3-4 variants: the masks' buffers from torch's allocators and the copy through torch (before the
mask ring), and the ring with torch's events and copy instead of cuda-python's, against the ring
(``constrained``)."""
from aioinfer.worker.mask_ring import MaskRing
from benchmarks import structured_output_rounds as rounds


def torch_copy(engine):
    masks = engine.runner.grammar_masks
    masks.use_ring = False

    def undo():
        masks.use_ring = True
    return undo


def ring_torch(engine):
    masks = engine.runner.grammar_masks
    saved = masks._ring
    masks._ring = MaskRing(masks.num_words, masks.device, cuda_python=False)

    def undo():
        masks._ring = saved
    return undo


rounds.VARIANTS.update(torch_copy=torch_copy, ring_torch=ring_torch)

if __name__ == "__main__":
    rounds.main()
