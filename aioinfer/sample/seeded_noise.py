"""Counter-based Exp(1) noise for the sampler: one vectorised draw for the whole batch.

``noise[r, v]`` is a pure function of (``keys[r]``, ``v``): a splitmix64 stream keyed by the row's
64-bit key (mixed on the host from (request seed, tokens generated so far)), element ``v`` being
``mix(key + (v + 1) * golden)``. Nothing about the batch (its size, the row's position, other
rows) enters, so a seeded request draws the same tokens in any batch, and a preempted request that
is recomputed draws the same noise again.

Two implementations compute the same 64-bit hash bit for bit: a pure-torch one on int64 tensors
(the CPU path and the reference; int64 arithmetic wraps like uint64, and logical shifts are an
arithmetic shift plus a mask) and a Triton kernel (the CUDA path: one pass, one program per (row,
vocabulary block), keys read from a device tensor, no host sync). The top 23 bits become
``u = (k + 0.5) / 2**23`` in (0, 1) exactly representable in float32 (never 0 or 1), and
``E = -log(u)``; so the CPU and the GPU draw the same ``u`` and their ``E`` differ at most by the
last bit of their ``log``. Triton is imported only when a CUDA tensor asks for it.
"""

from __future__ import annotations

import numpy as np
import torch

from aioinfer.utils.triton_launch import CompiledLaunch, triton_available

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_UNIFORM_BITS = 23  # u = (k + 0.5) / 2**23 is exact in float32 and stays strictly inside (0, 1)


def to_int64(value: int) -> int:
    """The int64 with the same 64 bits as ``value mod 2**64`` (for storing uint64 keys in torch)."""
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


def splitmix64(x: int) -> int:
    """The splitmix64 output function on a Python int (mod 2**64), for host-side key mixing."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * _MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX2) & _MASK64
    return x ^ (x >> 31)


def noise_key(seed: int, step: int) -> int:
    """The row key (as an int64 value) for (request seed, tokens generated before this one).

    Two rounds of splitmix64 keep nearby (seed, step) pairs from giving related streams.
    """
    return to_int64(splitmix64(splitmix64(seed & _MASK64) ^ (step & _MASK64)))


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    """``splitmix64`` on a uint64 array (array arithmetic wraps mod 2**64 silently)."""
    x = x + np.uint64(_GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX2)
    return x ^ (x >> np.uint64(31))


def noise_keys(seeds: list[int], steps: list[int]) -> np.ndarray:
    """``noise_key`` of every (seed, step) pair, as one int64 array: the batch's keys in a few NumPy
    ops instead of ~1.5 us of Python big-int arithmetic per row (0.4 ms at 256 rows, every step)."""
    z = _splitmix64_np(np.array([seed & _MASK64 for seed in seeds], dtype=np.uint64))
    z ^= np.array(steps, dtype=np.uint64)
    return _splitmix64_np(z).view(np.int64)


# ----------------------------------------------------------------------------- pure torch

def _srl(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic on signed ints)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix_(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function on int64 tensors, in place (multiplication wraps mod 2**64)."""
    z ^= _srl(z, 30)
    z *= to_int64(_MIX1)
    z ^= _srl(z, 27)
    z *= to_int64(_MIX2)
    z ^= _srl(z, 31)
    return z


def hash_bits_torch(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The 64 random bits of every (row, token) as int64: [N] int64 keys -> [N, V] int64."""
    offsets = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=keys.device) * to_int64(_GOLDEN)
    return _mix_(keys.unsqueeze(1) + offsets)


def seeded_exponential_torch(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exp(1) noise [N, V] float32 from int64 row keys [N]; the reference for the Triton kernel."""
    top = _srl(hash_bits_torch(keys, vocab_size), 64 - _UNIFORM_BITS)  # [N, V] in [0, 2**23)
    u = top.to(torch.float32).add_(0.5).mul_(2.0 ** -_UNIFORM_BITS)
    return u.log_().neg_()


# ----------------------------------------------------------------------------- Triton (CUDA)

_kernel = None


def _get_kernel():
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def seeded_exponential_kernel(keys_ptr, out_ptr, vocab_size, out_row_stride,
                                      BLOCK: tl.constexpr, RAW_BITS: tl.constexpr):
            row = tl.program_id(0)
            offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < vocab_size
            key = tl.load(keys_ptr + row).to(tl.uint64, bitcast=True)
            z = key + (offs.to(tl.uint64) + 1) * 0x9E3779B97F4A7C15
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
            z = (z ^ (z >> 27)) * 0x94D049BB133111EB
            z = z ^ (z >> 31)
            out = out_ptr + row.to(tl.int64) * out_row_stride + offs
            if RAW_BITS:  # the 64 hash bits, for testing against the torch reference bit for bit
                tl.store(out, z.to(tl.int64, bitcast=True), mask=mask)
            else:
                u = ((z >> 41).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23
                tl.store(out, -tl.log(u), mask=mask)

        _kernel = CompiledLaunch(seeded_exponential_kernel)  # launched every sampling step: utils/triton_launch.py
    return _kernel


def seeded_exponential_triton(keys: torch.Tensor, vocab_size: int, block: int = 1024,
                              raw_bits: bool = False) -> torch.Tensor:
    """The Triton version of ``seeded_exponential_torch``: one launch for all rows.

    With ``raw_bits`` it returns ``hash_bits_torch``'s [N, V] int64 instead (tests).
    """
    if keys.dtype != torch.int64 or keys.dim() != 1:
        raise TypeError(f"keys must be a 1-D int64 tensor, got {keys.dtype} {tuple(keys.shape)}")
    keys = keys.contiguous()
    out = torch.empty(keys.shape[0], vocab_size, dtype=torch.int64 if raw_bits else torch.float32,
                      device=keys.device)  # [N, V]
    if keys.shape[0] and vocab_size:
        import triton

        grid = (keys.shape[0], triton.cdiv(vocab_size, block))
        _get_kernel()(grid, keys, out, vocab_size, out.stride(0), block, raw_bits)
    return out


def seeded_exponential(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exp(1) noise [N, V] float32 for int64 row keys [N]; Triton on CUDA, torch elsewhere."""
    if keys.device.type == "cuda" and triton_available():
        return seeded_exponential_triton(keys, vocab_size)
    return seeded_exponential_torch(keys, vocab_size)
