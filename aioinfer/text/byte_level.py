"""GPT-2's byte-level alphabet, which ``tokenizers``' ByteLevel uses to write bytes as characters."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[int, str]:
    """Byte -> the character a byte-level vocabulary writes it as: printable bytes are themselves,
    the others are shifted to code points from 256 on."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    alphabet = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in alphabet:
            alphabet[b] = chr(256 + shifted)
            shifted += 1
    return alphabet
