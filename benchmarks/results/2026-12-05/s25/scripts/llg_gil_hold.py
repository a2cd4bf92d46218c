"""CPU (this machine): the GIL an llguidance batch call holds for 256 rows (the caller thread's CPU a
call; the work itself runs in llguidance's threads without it). PYTHONPATH=. python llg_gil_hold.py"""
import time, json, llguidance, llguidance.hf, torch
from transformers import AutoTokenizer
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS
tok = AutoTokenizer.from_pretrained(".ab/tok"); lt = llguidance.hf.from_tokenizer(tok)
g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(STRUCTURED_SCHEMAS["strings"]))
ms = [llguidance.LLMatcher(lt, g) for _ in range(256)]
ex = llguidance.LLExecutor(2)
W = (lt.vocab_size + 31)//32
buf = torch.empty((256, W), dtype=torch.int32)
plain = [(m, i) for i, m in enumerate(ms)]
# advance into the string: '{"notes": ["' tokens
ids = tok.encode('{"notes": ["hello')
for m in ms: assert m.consume_tokens(ids)
for name, fn in [("masks", lambda: ex.unsafe_compute_mask_ptr(plain, buf.data_ptr(), W*4, 256)),
                 ("consume+rollback", None)]:
    cpu = wall = 0.0
    for i in range(200):
        if fn:
            c, w = time.thread_time(), time.perf_counter(); fn(); cpu += time.thread_time() - c; wall += time.perf_counter() - w
        else:
            live = [(m, 1234) for m in ms]  # ' world'? any token in a string
            c, w = time.thread_time(), time.perf_counter(); ok = ex.consume_token_par(live); cpu += time.thread_time() - c; wall += time.perf_counter() - w
            for m in ms: m.rollback(1)
    print(name, "caller cpu %.1f us, wall %.1f us a call" % (cpu/200*1e6, wall/200*1e6), flush=True)
print(tok.decode([1234]), all(ok))
# pure tuple list build
t=time.perf_counter()
for i in range(1000): live=[(m, 1234) for m in ms]
print("build live list us", (time.perf_counter()-t)/1000*1e6)
