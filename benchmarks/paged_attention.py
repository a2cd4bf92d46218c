"""Workload 3: the Triton paged attention kernels against the copy-bandwidth floor and torch SDPA.

    python benchmarks/paged_attention.py --out paged_attention.json [--tune]

Decode (q_len 1) at batch {1, 8, 64} x context {128, 1024, 4096, 16384}, prefill at total tokens
{512, 4096, 16384} (sequences of min(T, 1024) tokens, no cached prefix, plus one chunked-prefill row:
the same tokens as 512-token chunks over a cached prefix of 1024), for qwen2.5-7b heads (28/4, d128)
and qwen2.5-0.5b heads (14/2, d64), bf16, block size 16, shuffled block tables.

Times are triton.testing.do_bench medians (CUDA events; eager launches, so small cases include
launch gaps) and, for decode, the median replay time of a CUDA graph of the same launch
(what the engine runs). Achieved bandwidth counts the bytes a kernel must move at least: every
context K/V byte once, plus q and out. The ceiling is a device-to-device copy measured in the same
run (bytes read + written). SDPA runs on contiguous [B, H, L, D] K/V of the same sizes
(enable_gqa=True), i.e. without paging. Inputs under 256 MB are rotated over several copies
so that repeated runs do not just hit the 60 MB L2. Prints the table last; writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = {"qwen2.5-7b": (28, 4, 128), "qwen2.5-0.5b": (14, 2, 64)}
BLOCK = 16
DTYPE = torch.bfloat16
ROTATE_BYTES = 256 << 20
DEV = "cuda"  # the CPU dry run (tests of this script) swaps it


def bench(fn, graph=False):
    import triton.testing as tt

    if graph:
        return tt.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
    return tt.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3  # us


def copy_bandwidth():
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device=DEV).random_(0, 255)
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a))
    del a, b
    return 2 * n / (t * 1e-6)


class Rotor:
    """Calls fn(i) for i = 0, 1, ... n-1, 0, ... so consecutive runs touch different memory."""

    def __init__(self, fns):
        self.fns, self.i = fns, 0

    def __call__(self):
        f = self.fns[self.i]
        self.i = (self.i + 1) % len(self.fns)
        return f()


def paged_case(seq_lens, q_lens, heads, gen, copies):
    """Caches + `copies` independent block tables (disjoint blocks) for the given lengths."""
    hq, hkv, d = heads
    per = sum(-(-n // BLOCK) for n in seq_lens)
    num_blocks = per * copies + 1
    ids = list(range(1, num_blocks))
    random.Random(0).shuffle(ids)
    kc = torch.randn(num_blocks, BLOCK, hkv, d, device=DEV, dtype=DTYPE, generator=gen)
    vc = torch.randn(num_blocks, BLOCK, hkv, d, device=DEV, dtype=DTYPE, generator=gen)
    max_blocks = max(-(-n // BLOCK) for n in seq_lens)
    tables, at = [], 0
    for _ in range(copies):
        bt = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
        for i, n in enumerate(seq_lens):
            nb = -(-n // BLOCK)
            bt[i, :nb] = torch.tensor(ids[at : at + nb], dtype=torch.int32)
            at += nb
        tables.append(bt.to(DEV))
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32, device=DEV)
    q = torch.randn(sum(q_lens), hq, d, device=DEV, dtype=DTYPE, generator=gen)
    return kc, vc, tables, sl, qsl, q


def kv_bytes(seq_lens, heads):
    _, hkv, d = heads
    return sum(seq_lens) * hkv * d * 2 * DTYPE.itemsize


def run_decode(model, heads, batch, ctx, gen, rows, tune_cfgs):
    from aioinfer.attention.triton_ops.decode import choose_num_splits, paged_decode

    hq, hkv, d = heads
    seq_lens = [ctx] * batch
    kvb = kv_bytes(seq_lens, heads)
    io = 2 * batch * hq * d * DTYPE.itemsize
    copies = max(1, min(16, math.ceil(ROTATE_BYTES / kvb)))
    kc, vc, tables, sl, _, q = paged_case(seq_lens, [1] * batch, heads, gen, copies)
    out = torch.empty_like(q)
    scale = d**-0.5
    splits = choose_num_splits(batch, hkv, ctx, q.device)

    def call(bt, ns=splits, cfg=None):
        return lambda: paged_decode(q, kc, vc, bt, sl, scale, max_seq_len=ctx, num_splits=ns, out=out, config=cfg)

    t_eager = bench(Rotor([call(bt) for bt in tables]))
    t_graph = bench(call(tables[0]), graph=True) if copies == 1 else bench(Rotor([call(bt) for bt in tables]), graph=True)
    # SDPA on contiguous K/V of the same size
    kd = torch.randn(batch, hkv, ctx, d, device=DEV, dtype=DTYPE, generator=gen)
    vd = torch.randn_like(kd)
    qd = q.view(batch, hq, 1, d)
    t_sdpa = bench(lambda: F.scaled_dot_product_attention(qd, kd, vd, scale=scale, enable_gqa=True))
    row = dict(kind="decode", model=model, batch=batch, ctx=ctx, num_splits=splits, copies=copies,
               bytes=kvb + io, us=t_eager, us_graph=t_graph, us_sdpa=t_sdpa)
    rows.append(row)
    for cfg in tune_cfgs:  # sweep tile / warps / stages / splits at this point
        c = {k: v for k, v in cfg.items() if k not in ("splits", "mult")}
        ns = cfg.get("splits", splits)
        if "mult" in cfg:
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            ns = max(1, min(-(-cfg["mult"] * sms // (batch * hkv)), -(-ctx // 256), 64))
        try:
            t = bench(Rotor([call(bt, ns, c or None) for bt in tables]), graph=True)
        except Exception as e:  # a config that does not compile (shared memory) is just skipped
            t = float("nan")
            print(f"  tune {cfg}: {type(e).__name__}: {str(e)[:120]}")
        rows.append(dict(kind="decode-tune", model=model, batch=batch, ctx=ctx, cfg=cfg, num_splits=ns,
                         bytes=kvb + io, us_graph=t))
    del kc, vc, kd, vd
    torch.cuda.empty_cache()


def run_prefill(model, heads, total, gen, rows, tune_cfgs=()):
    from aioinfer.attention.triton_ops.prefill import paged_prefill

    hq, hkv, d = heads
    scale = d**-0.5
    L = min(total, 1024)
    n = total // L
    # fresh prompts: context == queries
    kc, vc, tables, sl, qsl, q = paged_case([L] * n, [L] * n, heads, gen, 1)
    out = torch.empty_like(q)
    t = bench(lambda: paged_prefill(q, kc, vc, tables[0], sl, qsl, n, scale, out=out))
    flops = 4 * n * (L * (L + 1) / 2) * hq * d  # causal QK^T and PV
    qd = q.view(n, L, hq, d).transpose(1, 2)
    kd = torch.randn(n, hkv, L, d, device=DEV, dtype=DTYPE, generator=gen)
    vd = torch.randn_like(kd)
    t_sdpa = bench(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale, enable_gqa=True))
    rows.append(dict(kind="prefill", model=model, tokens=total, seqs=n, q_len=L, ctx=L, us=t, us_sdpa=t_sdpa,
                     flops=flops, bytes=kv_bytes([L] * n, heads) + 2 * q.numel() * DTYPE.itemsize))
    for cfg in tune_cfgs:
        try:
            tc = bench(lambda: paged_prefill(q, kc, vc, tables[0], sl, qsl, n, scale, out=out, config=cfg))
        except Exception as e:
            tc = float("nan")
            print(f"  tune {cfg}: {type(e).__name__}: {str(e)[:120]}")
        rows.append(dict(kind="prefill-tune", model=model, tokens=total, cfg=cfg, us=tc, flops=flops))
    # chunked prefill: 512-token chunks over a cached 1024-token prefix
    nc = total // 512
    kc, vc, tables, sl, qsl, q = paged_case([1024 + 512] * nc, [512] * nc, heads, gen, 1)
    out = torch.empty_like(q)
    t = bench(lambda: paged_prefill(q, kc, vc, tables[0], sl, qsl, nc, scale, out=out))
    flops = 4 * nc * (512 * 1024 + 512 * 513 / 2) * hq * d
    rows.append(dict(kind="chunked", model=model, tokens=total, seqs=nc, q_len=512, ctx=1536, us=t, us_sdpa=None,
                     flops=flops, bytes=kv_bytes([1536] * nc, heads) + 2 * q.numel() * DTYPE.itemsize))
    torch.cuda.empty_cache()


def launch_overhead(gen, n=300):
    """Host microseconds per eager call: the decode wrapper (checks + launch) vs launching the
    jitted kernel directly, and the prefill wrapper (what a non-graph step pays per layer)."""
    from aioinfer.attention.triton_ops import decode as dec
    from aioinfer.attention.triton_ops.prefill import paged_prefill

    heads = MODELS["qwen2.5-7b"]
    kc, vc, tables, sl, qsl, q = paged_case([128] * 8, [1] * 8, heads, gen, 1)
    out = torch.empty_like(q)
    bt = tables[0]
    cfg = dec.decode_config(128, DTYPE)
    fns = {
        "decode wrapper, 1 split": lambda: dec.paged_decode(q, kc, vc, bt, sl, 0.1, 128, num_splits=1, out=out),
        "decode kernel[grid] direct": lambda: dec._decode_kernel[(8, 4, 1)](
            q, kc, vc, out, out, out, bt, sl, 0.1, 1, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            kc.stride(0), kc.stride(1), kc.stride(2), bt.stride(0), G=7, G_PAD=16, HEAD_DIM=128, BLOCK_SIZE=BLOCK,
            TILE_N=cfg["TILE_N"], SPLIT=False, PRECISION="tf32", UPCAST=False,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]),
        "decode wrapper, 4 splits (2 launches)": lambda: dec.paged_decode(q, kc, vc, bt, sl, 0.1, 128, num_splits=4, out=out),
        "prefill wrapper": lambda: paged_prefill(q, kc, vc, bt, sl, qsl, 8, 0.1, out=out),
    }
    res = {}
    for name, fn in fns.items():
        for _ in range(min(n, 20)):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        res[name] = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize()
    return res


def check_target_correctness(gen):
    """The timed configuration, checked once against the fp32 reference (fresh random inputs)."""
    from aioinfer.attention.triton_ops.decode import paged_decode, paged_decode_reference

    heads = MODELS["qwen2.5-7b"]
    kc, vc, tables, sl, _, q = paged_case([4096] * 8, [1] * 8, heads, gen, 1)
    out = paged_decode(q, kc, vc, tables[0], sl, heads[2] ** -0.5, max_seq_len=4096)
    ref = paged_decode_reference(q.float(), kc.float(), vc.float(), tables[0], sl, heads[2] ** -0.5)
    return (out.float() - ref).abs().max().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write all rows as JSON here")
    ap.add_argument("--tune", action="store_true", help="also sweep decode configs at the target (7b, batch 64, ctx 4096)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,8,64", help="decode batch sizes (the workload: 1,8,64)")
    ap.add_argument("--contexts", default="128,1024,4096,16384", help="decode context lengths (the workload's)")
    ap.add_argument("--prefill-tokens", default="512,4096,16384", help="prefill total tokens (the workload's)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    import triton

    gen = torch.Generator(device=DEV).manual_seed(0)
    t0 = time.time()
    bw = copy_bandwidth()
    err = check_target_correctness(gen)
    overhead = launch_overhead(gen)
    rows = []
    tune, ptune, points = [], [], set()
    if args.tune:
        tune = [dict(TILE_N=t, num_warps=4, num_stages=2 if t == 128 else 3, mult=m) for t in (64, 128) for m in (1, 2, 4)]
        tune += [dict(TILE_N=32, num_warps=4, num_stages=2, mult=2), dict(TILE_N=128, num_warps=8, num_stages=3, mult=2)]
        points = {("qwen2.5-7b", 1, 16384), ("qwen2.5-7b", 8, 4096), ("qwen2.5-7b", 8, 16384), ("qwen2.5-7b", 64, 4096),
                  ("qwen2.5-0.5b", 64, 4096), ("qwen2.5-0.5b", 8, 16384)}
        ptune = [dict(BLOCK_M=bm, TILE_N=tn, num_warps=w, num_stages=st) for bm, tn, w, st in
                 [(128, 64, 8, 2), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 32, 4, 3),
                  (64, 64, 4, 3), (64, 128, 4, 2), (128, 128, 8, 3)]]
    for model in args.models.split(","):
        heads = MODELS[model]
        for batch in _ints(args.batches):
            for ctx in _ints(args.contexts):
                run_decode(model, heads, batch, ctx, gen, rows, tune if (model, batch, ctx) in points else [])
        for total in _ints(args.prefill_tokens):
            run_prefill(model, heads, total, gen, rows, ptune if total == 16384 else ())
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d"), copy_bw=bw, dtype=str(DTYPE), block_size=BLOCK,
                decode_max_abs_err_b8_ctx4096=err, host_us_per_call=overhead, seconds=time.time() - t0)
    if args.out:
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))

    print(f"\n# paged attention (workload 3) on {meta['device']}, torch {meta['torch']}, triton {meta['triton']}, "
          f"{meta['date']}; copy bandwidth {bw / 1e12:.2f} TB/s; decode max abs err vs fp32 {err:.2e}")
    print("host us per eager call: " + ", ".join(f"{k} {v:.1f}" for k, v in overhead.items()))
    tuned = [r for r in rows if r["kind"] == "decode-tune"]
    if tuned:
        print("\n## decode sweep (CUDA-graph replay us, % of copy bw); mult = grid target in programs per SM")
        for r in tuned:
            c = r["cfg"]
            print(f"{r['model']:13s} b{r['batch']:<3d} ctx{r['ctx']:<6d} T{c['TILE_N']:<4d} w{c['num_warps']} s{c['num_stages']} "
                  f"mult{c.get('mult', '-')} splits={r['num_splits']:2d} {r['us_graph']:8.1f} "
                  f"{r['bytes'] / (r['us_graph'] * 1e-6) / bw * 100:6.1f}%")
    ptuned = [r for r in rows if r["kind"] == "prefill-tune"]
    if ptuned:
        print("\n## prefill sweep at 16384 tokens (16 x 1024, eager us, TFLOP/s)")
        for r in ptuned:
            print(f"{r['model']:13s} {str(r['cfg']):62s} {r['us']:8.1f} {r['flops'] / (r['us'] * 1e-6) / 1e12:7.1f}")
    print("\n## decode (bf16, block 16): us eager / us graph / SDPA us; achieved GB/s (graph) and % of copy bw")
    print(f"{'model':13s} {'batch':>5s} {'ctx':>6s} {'splits':>6s} {'us':>8s} {'us_graph':>8s} {'GB/s':>7s} {'%copy':>6s} "
          f"{'sdpa_us':>8s} {'sdpa/ours':>9s}")
    for r in rows:
        if r["kind"] != "decode":
            continue
        gbs = r["bytes"] / (r["us_graph"] * 1e-6) / 1e9
        print(f"{r['model']:13s} {r['batch']:5d} {r['ctx']:6d} {r['num_splits']:6d} {r['us']:8.1f} {r['us_graph']:8.1f} "
              f"{gbs:7.0f} {gbs * 1e9 / bw * 100:5.1f}% {r['us_sdpa']:8.1f} {r['us_sdpa'] / r['us']:9.2f}")
    print("\n## prefill (paged, causal): us; TFLOP/s; SDPA (contiguous) us")
    print(f"{'model':13s} {'kind':8s} {'tokens':>6s} {'seqs':>4s} {'q_len':>5s} {'ctx':>5s} {'us':>8s} {'TFLOP/s':>8s} "
          f"{'sdpa_us':>8s} {'sdpa/ours':>9s}")
    for r in rows:
        if r["kind"] not in ("prefill", "chunked"):
            continue
        sd = f"{r['us_sdpa']:8.1f} {r['us_sdpa'] / r['us']:9.2f}" if r["us_sdpa"] else f"{'-':>8s} {'-':>9s}"
        print(f"{r['model']:13s} {r['kind']:8s} {r['tokens']:6d} {r['seqs']:4d} {r['q_len']:5d} {r['ctx']:5d} "
              f"{r['us']:8.1f} {r['flops'] / (r['us'] * 1e-6) / 1e12:8.1f} {sd}")


def _ints(csv: str) -> list[int]:
    return [int(x) for x in csv.split(",") if x]


if __name__ == "__main__":
    main()
