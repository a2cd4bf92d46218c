"""CPU (this machine): llguidance's batch masks and consume_token_par for 256 matchers of the
free-strings schema, walked through 60 tokens, on 1 and 2 threads. PYTHONPATH=. python llg_consume_time.py"""
import time, json, llguidance, llguidance.hf, torch
from transformers import AutoTokenizer
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS
tok = AutoTokenizer.from_pretrained(".ab/tok"); lt = llguidance.hf.from_tokenizer(tok)
g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(STRUCTURED_SCHEMAS["strings"]))
print(json.dumps(STRUCTURED_SCHEMAS["strings"])[:300])
ms = [llguidance.LLMatcher(lt, g) for _ in range(256)]
for nth in (1, 2):
    ex = llguidance.LLExecutor(nth)
    W = (lt.vocab_size + 31)//32
    buf = torch.empty((256, W), dtype=torch.int32)
    plain = [(m, i) for i, m in enumerate(ms)]
    # walk: pick greedy-ish allowed tokens: the highest allowed id < 10000? use first allowed token >= 300
    tc = tm = 0; n = 0
    for step in range(60):
        t = time.perf_counter(); ex.unsafe_compute_mask_ptr(plain, buf.data_ptr(), W*4, 256); tm += time.perf_counter() - t
        toks = []
        for i in range(256):
            row = buf[i, 9:300].numpy()  # tokens 288..9600
            nz = row.nonzero()[0]
            if len(nz):
                w = int(nz[(i + step) % len(nz)]) + 9; v = int(buf[i, w]) & 0xffffffff
                toks.append(32*w + (v & -v).bit_length() - 1)
            else:
                r = buf[i].numpy().nonzero()[0]; w = int(r[0]); v = int(buf[i, w]) & 0xffffffff; toks.append(32*w + (v & -v).bit_length()-1)
        live = list(zip(ms, toks))
        t = time.perf_counter(); ok = ex.consume_token_par(live); tc += time.perf_counter() - t
        assert all(ok), step
        n += 1
    print(nth, "threads: masks %.3f ms, consume %.3f ms a step" % (tm/n*1e3, tc/n*1e3))
    for m in ms: m.reset()
print(repr(tok.decode([t for _, t in live][:1])))
