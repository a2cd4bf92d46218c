"""CUDA: ``CompiledLaunch`` (utils/triton_launch.py) launches a kernel through the compiled kernel of
its first launch with the same key, and gives what the JIT's launch gives: the structured-output
apply against its reference over rows, dtypes, row subsets, an unaligned logits view and a side
stream; the sampler's noise kernel bit for bit against its torch form."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


def test_the_apply_through_its_compiled_kernel_equals_the_reference():
    device = _cuda()
    from aioinfer.structured_output import bitmask_apply

    vocab = 151936
    num_words = (vocab + 31) // 32
    generator = torch.Generator().manual_seed(0)
    launch = bitmask_apply._get_kernel()
    kept, direct = launch.num_compiled, launch.num_direct
    side = torch.cuda.Stream(device)
    cases = [(dtype, num_masks, subset, False) for dtype in (torch.float32, torch.bfloat16)
             for num_masks, subset in ((4, False), (7, False), (3, True), (4, False))]
    cases += [(torch.float32, 5, False, True), (torch.float32, 5, False, True)]  # an unaligned view, twice
    for step, (dtype, num_masks, subset, unaligned) in enumerate(cases):
        rows_total = num_masks + 3 if subset else num_masks  # without rows, a mask for every row
        logits = torch.randn((rows_total, vocab), generator=generator).to(dtype)
        bits = torch.randint(-2**31, 2**31 - 1, (num_masks, num_words), generator=generator, dtype=torch.int32)
        rows = torch.randperm(rows_total, generator=generator)[:num_masks] if subset else None
        expected = bitmask_apply.apply_bitmask_reference(logits.clone(), bits, rows)
        if unaligned:  # rows of a wider buffer, 4 bytes in: another pointer specialization and stride
            wide = torch.zeros((rows_total, vocab + 1), dtype=dtype, device=device)
            wide[:, 1:] = logits.to(device)
            on_device = wide[:, 1:]
            assert on_device.data_ptr() % 16 != 0
        else:
            on_device = logits.to(device)
        bits_on_device = bits.to(device)
        rows_on_device = None if rows is None else rows.to(device)
        stream = side if step % 3 == 2 else torch.cuda.current_stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            got = bitmask_apply.apply_bitmask_triton(on_device, bits_on_device, rows_on_device)
        stream.synchronize()
        assert torch.equal(got.cpu(), expected), step
    # At most one kernel a specialization (dtype x all rows or a subset, and the unaligned view); every
    # other launch went through a kept one.
    assert launch.num_compiled - kept <= 5
    assert launch.num_direct - direct >= len(cases) - 5


def test_the_noise_through_its_compiled_kernel_equals_its_torch_form():
    device = _cuda()
    from aioinfer.sample import seeded_noise

    for rows, vocab in ((3, 151936), (8, 151936), (3, 1000)):
        keys = torch.tensor([seeded_noise.noise_key(s, s * 7) for s in range(rows)], dtype=torch.int64)
        for _ in range(2):  # the second launch of a key goes through the kept kernel
            bits = seeded_noise.seeded_exponential_triton(keys.to(device), vocab, raw_bits=True)
            assert torch.equal(bits.cpu(), seeded_noise.hash_bits_torch(keys, vocab))
    assert seeded_noise._get_kernel().num_compiled >= 2  # two vocabularies, at least
