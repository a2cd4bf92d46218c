"""Probe: tile, warps, stages and splits of the Triton decode-attention kernel at small batches (GPU).

Decode attention at small batches and short contexts (workload 2's regime): tile size, warps and
split count of the Triton decode kernel, timed as CUDA-graph replays (kernel + merge).

    python -m benchmarks.probes.decode_attention_small --out decode_small.json

At batch 1 the 7b decode kernel has only num_kv_heads x num_splits programs; the H200 profile of
workload 2 showed 6.9 us a layer for a ~300-token context (0.6 MB of K/V), i.e. latency, not
bandwidth. This sweeps (TILE_N, num_warps, num_stages) x num_splits at batch {1, 4, 8} and
context {128, 384, 1024, 4096} for qwen2.5-7b heads, with the K/V rotated over enough copies to
leave the L2, and prints what the engine's current choice (``choose_num_splits`` with the
engine's max_model_len) costs next to the best found. Table last; JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from benchmarks.paged_attention import MODELS, Rotor, bench, kv_bytes, paged_case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--contexts", default="128,384,1024,4096")
    ap.add_argument("--splits", default="1,2,4,8,16,32,64")
    ap.add_argument("--configs", default="16,2,1;32,2,2;32,4,2;64,4,2;64,2,2;128,4,2",
                    help="TILE_N,num_warps,num_stages;...")
    ap.add_argument("--max-model-lens", default="400,32768", help="for the engine's current split choice")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from aioinfer.attention.triton_ops.decode import choose_num_splits, decode_config, paged_decode

    gen = torch.Generator(device="cuda").manual_seed(0)
    heads = MODELS["qwen2.5-7b"]
    hq, hkv, d = heads
    configs = [dict(zip(("TILE_N", "num_warps", "num_stages"), map(int, c.split(",")))) for c in args.configs.split(";")]
    rows, table = [], []
    for batch in map(int, args.batches.split(",")):
        for ctx in map(int, args.contexts.split(",")):
            seq_lens = [ctx] * batch
            kvb = kv_bytes(seq_lens, heads)
            copies = max(1, min(256, math.ceil((256 << 20) / kvb)))
            kc, vc, tables, sl, _, q = paged_case(seq_lens, [1] * batch, heads, gen, copies)
            out = torch.empty_like(q)

            def timed(ns, cfg):
                fns = [lambda bt=bt: paged_decode(q, kc, vc, bt, sl, d**-0.5, max_seq_len=ctx, num_splits=ns, out=out,
                                                  config=cfg) for bt in tables]
                return bench(Rotor(fns), graph=True)

            current = {}
            for mml in map(int, args.max_model_lens.split(",")):
                ns = choose_num_splits(batch, hkv, mml, q.device)
                current[mml] = (ns, timed(ns, decode_config(d, q.dtype)))
            best = (math.inf, None, None)
            for cfg in configs:
                for ns in map(int, args.splits.split(",")):
                    if ns > 1 and (ns - 1) * cfg["TILE_N"] >= ctx:
                        continue  # more splits than tiles: the extra programs are empty
                    try:
                        t = timed(ns, cfg)
                    except Exception as e:  # noqa: BLE001 - shared memory etc.: skip the config
                        print(f"  {cfg} splits {ns}: {type(e).__name__}: {str(e)[:100]}")
                        continue
                    rows.append(dict(batch=batch, ctx=ctx, cfg=cfg, splits=ns, us=t))
                    if t < best[0]:
                        best = (t, cfg, ns)
            cur = "; ".join(f"mml {m}: {ns} splits {t:.2f} us" for m, (ns, t) in current.items())
            print(f"b{batch} ctx {ctx}: {cur}; best {best[0]:.2f} us {best[1]} splits {best[2]}", flush=True)
            rows.append(dict(batch=batch, ctx=ctx, current={str(m): v for m, v in current.items()},
                             best=dict(us=best[0], cfg=best[1], splits=best[2])))
            table.append([batch, ctx, *(f"{ns} / {t:.2f}" for ns, t in current.values()), f"{best[0]:.2f}",
                          f"{best[1]['TILE_N']},{best[1]['num_warps']},{best[1]['num_stages']}", best[2]])
            kc = vc = tables = None
            torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    mmls = args.max_model_lens.split(",")
    head = ["batch", "ctx", *(f"now (mml {m}): splits / us" for m in mmls), "best us", "best tile,warps,stages",
            "best splits"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in table:
        print("| " + " | ".join(str(x) for x in r) + " |")


if __name__ == "__main__":
    main()
