"""FP8 layers split over two real processes (gloo, CPU): each rank keeps exactly its part of the
FP8 weights and of their scales, for checkpoint tensors (per row, per tensor, per block) and for
weights quantized as they load.

Oracle: the same layers built unsharded from the same whole tensors. Column-parallel layers (q/k/v,
gate/up) hold the rows of the unsharded ones with their scales, and their products equal the
unsharded product's columns; row-parallel layers (o, down) hold the unsharded weight's columns
(per-row scales whole; a block scale's columns split with them). Quantizing a float weight as it
loads takes the rank's own columns' amax in a row-parallel layer, and the online format's one scale
per layer is the rank's own largest row scale, so for online weights the dequantized weights are
compared within two e4m3 roundings a side, and the products within the error that allows.
"""

from __future__ import annotations

import socket

import torch

from aioinfer.layers.quantization.fp8 import FP8, dequantize_blocks, dequantize_rows, quantize_blocks, quantize_rows

HIDDEN, HEAD_DIM, HEADS, KV_HEADS, INTER = 32, 16, 4, 2, 32
BLOCK = (16, 16)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(cls_args, tp, config):
    from aioinfer.layers.quantization.fp8_linear import Fp8Linear

    cls, args = cls_args
    with torch.device("meta"):
        layer = cls(*args, tp=tp)
    layer.quant = Fp8Linear(layer, config, "test")
    layer.to_empty(device="cpu")
    return layer


def _dequantized(layer):
    if layer.quant.block is not None:
        return dequantize_blocks(layer.weight, getattr(layer, layer.quant.block_scale), BLOCK)
    return dequantize_rows(layer.weight, layer.weight_scale)


def _check(rank: int, port: int) -> None:
    from aioinfer.distributed.group import SINGLE, destroy_tp_group, init_tp_group
    from aioinfer.layers.linear import MergedLinear, QKVLinear, RowParallelLinear
    from aioinfer.layers.quantization.config import QuantConfig

    tp = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", torch.device("cpu"))
    try:
        torch.manual_seed(0)  # every rank draws the same whole tensors
        qkv_w = {n: torch.randn(h * HEAD_DIM, HIDDEN) for n, h in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS))}
        gate_up = [torch.randn(INTER, HIDDEN), torch.randn(INTER, HIDDEN)]
        down_w = torch.randn(HIDDEN, INTER)
        x, act = torch.randn(5, HIDDEN), torch.randn(5, INTER)
        layers = {
            "qkv": (QKVLinear, (HIDDEN, HEAD_DIM, HEADS, KV_HEADS, False)),
            "gate_up": (MergedLinear, (HIDDEN, [INTER, INTER])),
            "down": (RowParallelLinear, (INTER, HIDDEN)),
        }
        pieces = {"qkv": list(zip("qkv", qkv_w.values())), "gate_up": list(enumerate(gate_up)),
                  "down": [(None, down_w)]}
        for kind in ("checkpoint rows", "checkpoint tensor", "checkpoint blocks", "online"):
            block = kind == "checkpoint blocks"
            config = QuantConfig(source="fp8" if block else ("online" if kind == "online" else "compressed-tensors"),
                                 weights="block" if block else ("tensor" if kind == "online" else "channel"),
                                 block=BLOCK if block else None)
            for name, spec in layers.items():
                ours, whole = _build(spec, tp, config), _build(spec, SINGLE, config)
                for layer in (ours, whole):
                    for shard, w in pieces[name]:
                        if kind == "online":
                            layer.weight_loader(layer.weight, w, shard)
                            continue
                        if block:
                            q, s = quantize_blocks(w, BLOCK)
                            scale = layer.weight_scale_inv
                        elif kind == "checkpoint rows":
                            q, s = quantize_rows(w)  # [N, 1], as compressed-tensors stores it
                            scale = layer.weight_scale
                        else:
                            s = (w.abs().amax() / 448).reshape(1)
                            q, scale = (w / s).clamp(-448, 448).to(FP8), layer.weight_scale
                        layer.weight_loader(layer.weight, q, shard)
                        layer.weight_loader(scale, s, shard)
                    layer.quant.finish(layer)
                got, want = _dequantized(ours), _dequantized(whole)
                if name == "down":  # row-parallel: this rank's columns
                    want = want[:, rank * INTER // 2:(rank + 1) * INTER // 2]
                    if kind == "online":  # the rank's own amax: within one e4m3 step of the whole row's
                        step = max(ours.weight_scale.max(), whole.weight_scale.max()) * 2.0**-8  # e4m3's subnormal step
                        assert ((got - want).abs() <= want.abs() / 4 + step).all(), kind  # two roundings a side
                        continue
                    assert torch.equal(got, want), (kind, name)
                    torch.testing.assert_close(ours(act[:, rank * INTER // 2:(rank + 1) * INTER // 2]).shape,
                                               torch.Size([5, HIDDEN]))
                    continue
                rows = [(start, size) for start, size in (whole.rows(s) for s, _ in pieces[name])]
                mine = [(ours.rows(s)[0], ours.rows(s)[1]) for s, _ in pieces[name]]
                for (start, size), (my_start, my_size) in zip(rows, mine):
                    assert my_size * 2 == size
                    theirs = want[start + rank * my_size:start + (rank + 1) * my_size]
                    mine_w = got[my_start:my_start + my_size]
                    product = ours(x)[:, my_start:my_start + my_size]
                    expected = whole(x)[:, start + rank * my_size:start + (rank + 1) * my_size]
                    if kind == "online":
                        step = max(ours.weight_scale.max(), whole.weight_scale.max()) * 2.0**-8
                        assert ((mine_w - theirs).abs() <= theirs.abs() / 4 + step).all(), (kind, name)
                        assert (product - expected).abs().max() <= 0.05 * expected.abs().max(), (kind, name)
                        continue
                    assert torch.equal(mine_w, theirs), (kind, name)
                    torch.testing.assert_close(product, expected)
    finally:
        destroy_tp_group()


def test_fp8_layers_split_over_two_processes_keep_their_part():
    torch.multiprocessing.spawn(_check, args=(_free_port(),), nprocs=2)
