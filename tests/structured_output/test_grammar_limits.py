"""The bounds on what a constraint may cost (structured_output/limits.py, compile_threads.py,
compiler.py) and the engine's view of a grammar that fails mid-output (structured_output/grammar_mask.py).

The real server path of each is in tests/server/test_server_grammar_limits.py; here the pieces, fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from aioinfer import SamplingParams
from aioinfer.errors import EngineOverloaded
from aioinfer.structured_output import InvalidGrammarError, StructuredOutputsParams
from aioinfer.structured_output.compile_threads import CompileBusy, CompileThreads
from aioinfer.structured_output.compiler import GrammarCompiler
from aioinfer.structured_output.limits import (MAX_GRAMMAR_RULES, MAX_SCHEMA_DEPTH, ConstraintLimitError,
                                               GrammarLimits, check_size, check_structure)
from aioinfer.structured_output.grammar_mask import GrammarMasks, LiveTokens
from aioinfer.sample.sampling_metadata import SamplingRow
from deep_schemas import UNSATISFIABLE, anyof_chain, items_chain, ref_chain, rule_chain

VOCAB = 49152
EOS = 2  # SmolLM2's


def nested_arrays(n: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(n):
        schema = {"type": "array", "items": schema}
    return schema


# The shapes that killed the server (issue 54, item 2), each just past its bound.
TOO_DEEP = {
    "$ref chain": StructuredOutputsParams(json=ref_chain(MAX_SCHEMA_DEPTH + 10)),
    "anyOf chain": StructuredOutputsParams(json=anyof_chain(MAX_SCHEMA_DEPTH // 3 + 10)),
    "items chain": StructuredOutputsParams(json=items_chain(MAX_SCHEMA_DEPTH // 2 + 10)),
    "nesting": StructuredOutputsParams(json=nested_arrays(MAX_SCHEMA_DEPTH)),
    "Lark rules": StructuredOutputsParams(grammar=rule_chain(MAX_GRAMMAR_RULES)),
    "GBNF rules": StructuredOutputsParams(grammar=rule_chain(MAX_GRAMMAR_RULES, gbnf=True)),
    "%json in Lark": StructuredOutputsParams(grammar="start: %json " + json.dumps(ref_chain(MAX_SCHEMA_DEPTH + 10))),
    "structural tag": StructuredOutputsParams(structural_tag={
        "structures": [{"begin": "<f>", "schema": ref_chain(MAX_SCHEMA_DEPTH + 10), "end": "</f>"}],
        "triggers": ["<f>"]}),
}


@pytest.mark.parametrize("name", list(TOO_DEEP))
def test_constraints_deeper_than_the_bounds_are_refused_before_compiling(name):
    with pytest.raises(ConstraintLimitError, match=r"(deeper than|more than the limit of) \d+"):
        check_structure(TOO_DEEP[name])


def test_ordinary_deep_and_recursive_constraints_pass():
    tree = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}
    for params in [StructuredOutputsParams(json=tree), StructuredOutputsParams(json=ref_chain(MAX_SCHEMA_DEPTH // 2)),
                   StructuredOutputsParams(json=nested_arrays(MAX_SCHEMA_DEPTH // 2)),
                   StructuredOutputsParams(json={"type": "string", "$defs": ref_chain(5000)["$defs"]}),  # never referenced
                   StructuredOutputsParams(grammar=rule_chain(MAX_GRAMMAR_RULES - 10))]:
        check_structure(params)


def test_the_depth_walk_is_iterative():
    """A schema far deeper than Python's recursion limit is refused, not a RecursionError (nor a crash)."""
    deep: dict = {}
    node = deep
    for _ in range(100_000):
        node["not"] = {}
        node = node["not"]
    params = StructuredOutputsParams(json=deep)
    with pytest.raises(ConstraintLimitError, match="deeper than"):
        check_structure(params)
    with pytest.raises(InvalidGrammarError, match="nests too deeply"):
        StructuredOutputsParams(json="[" * 100_000 + "]" * 100_000)


def test_references_into_nested_parts_count_every_subschema_they_reach_again():
    """Each $ref target's subtree is compiled once more: ~110 KB pointing at each of its own L nested
    levels (W subschemas each) ask for ~W * L^2 / 2 subschemas, and are refused for it, not walked for seconds."""
    levels, width = 250, 10
    root: dict = {"anyOf": []}
    node, path = root, "#"
    for _ in range(levels):
        node["n"] = {"anyOf": [{"type": "integer"} for _ in range(width)]}
        node, path = node["n"], path + "/n"
        root["anyOf"].append({"$ref": path})
    assert len(json.dumps(root)) < 200_000
    with pytest.raises(ConstraintLimitError, match="subschemas"):
        check_structure(StructuredOutputsParams(json=root))


def test_the_size_bound_counts_bytes_and_names_its_setting():
    limits = GrammarLimits(max_bytes=100)
    params = StructuredOutputsParams(regex="é" * 60)  # 60 characters, 120 bytes
    with pytest.raises(ConstraintLimitError, match="120 bytes.*structured_outputs_max_bytes"):
        check_size(params, params.key[1], limits)
    small = StructuredOutputsParams(regex="é" * 40)
    check_size(small, small.key[1], limits)


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    return GrammarCompiler(smollm2_tokenizer, VOCAB, [EOS])


@pytest.mark.parametrize("name", list(UNSATISFIABLE))
def test_a_constraint_that_matches_nothing_is_refused(compiler, name):
    with pytest.raises(InvalidGrammarError, match="matches no output"):
        compiler.compile(StructuredOutputsParams(**UNSATISFIABLE[name]))


def test_choices_are_one_lexeme(compiler, smollm2_tokenizer):
    """Prefixes of one another all stay reachable, and 10,000 choices of 100 characters (an Earley row
    of 10,001 items as rule alternatives: llguidance's row limit at the first token) are taken."""
    for text in ("a", "ab", "abc"):
        matcher = compiler.compile(StructuredOutputsParams(choice=["abc", "a", "ab"]))
        assert matcher.consume_tokens(smollm2_tokenizer.encode(text, add_special_tokens=False))
        assert matcher.is_accepting() and not matcher.is_error()
    items = [f"{i:04d}" + "x" * 96 for i in range(10_000)]
    matcher = compiler.compile(StructuredOutputsParams(choice=items))
    assert matcher.consume_tokens(smollm2_tokenizer.encode(items[1234], add_special_tokens=False))
    assert matcher.is_accepting() and not matcher.is_error()


def test_a_compile_over_budget_is_refused_and_remembered(smollm2_tokenizer):
    compiler = GrammarCompiler(smollm2_tokenizer, VOCAB, [EOS], limits=GrammarLimits(compile_timeout=0.05))
    compiler.llg_tokenizer()
    slow = StructuredOutputsParams(grammar="start: x\nx: " + " | ".join(f'"{i:07d}"' for i in range(20_000)))
    with pytest.raises(ConstraintLimitError, match="did not compile within 0.05 s.*structured_outputs_compile_timeout"):
        compiler.prepare(slow)
    with pytest.raises(ConstraintLimitError, match="did not compile within"):  # at once, from the cache
        compiler.compile(slow)


def test_a_compile_that_cannot_start_within_the_budget_is_an_overload(smollm2_tokenizer):
    threads = CompileThreads(1)
    release = threading.Event()
    blocker = threading.Thread(target=threads.run, args=(release.wait,), kwargs={"timeout": 30})
    blocker.start()
    try:
        with pytest.raises(CompileBusy):
            threads.run(lambda: None, timeout=0.2)
    finally:
        release.set()
        blocker.join()
    compiler = GrammarCompiler(smollm2_tokenizer, VOCAB, [EOS], limits=GrammarLimits(compile_timeout=0.2), threads=1)
    release.clear()
    blocker = threading.Thread(target=compiler._threads.run, args=(release.wait,), kwargs={"timeout": 30})
    blocker.start()
    try:
        with pytest.raises(EngineOverloaded, match="busy"):
            compiler.compile(StructuredOutputsParams(regex="a+"))
    finally:
        release.set()
        blocker.join()


def test_compile_threads_run_at_a_lower_priority():
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    theirs = CompileThreads(1).run(os.getpriority, os.PRIO_PROCESS, 0, timeout=30)
    assert theirs > mine or mine == 19


EXIT_DURING_A_COMPILE = """if True:
    import sys, threading, time
    from aioinfer.structured_output.compile_threads import CompileThreads

    started = threading.Event()

    def compile_():  # stands in for llguidance, which a thread must not be inside while the interpreter ends
        started.set()
        time.sleep(0.5)
        open(sys.argv[1], "w").write("finished")

    pool = CompileThreads(1)
    threading.Thread(target=pool.run, args=(compile_,), kwargs={"timeout": 60}, daemon=True).start()
    started.wait()
    sys.exit(0)
"""


def test_the_interpreter_exit_waits_for_a_compile_in_progress(tmp_path):
    """Compile threads are daemons, yet exit joins them first: a daemon thread inside a Rust extension
    when the interpreter finalizes is ended by pthread_exit, whose unwind aborts the process."""
    marker = tmp_path / "compiled"
    result = subprocess.run([sys.executable, "-c", EXIT_DURING_A_COMPILE, str(marker)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "finished"


def test_compile_threads_have_the_stack_for_what_the_bounds_let_through(smollm2_gguf):
    """Past the bounds, on purpose: a $ref chain that overflows an 8 MiB stack (SIGSEGV) compiles on a
    compile thread. In a child process, since a failure here is a crash."""
    code = f"""
import json, sys, threading
from transformers import AutoTokenizer
import llguidance
from aioinfer.structured_output.compile_threads import CompileThreads
from aioinfer.structured_output.llg_tokenizer import llg_tokenizer
hf = AutoTokenizer.from_pretrained({str(smollm2_gguf.parent)!r}, gguf_file={smollm2_gguf.name!r})
defs = {{f"d{{i}}": {{"$ref": f"#/$defs/d{{i + 1}}"}} for i in range(3000)}}
defs["d3000"] = {{"type": "string"}}
grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps({{"$ref": "#/$defs/d0", "$defs": defs}}))
tokenizer = llg_tokenizer(hf, {VOCAB}, [{EOS}])
assert threading.stack_size() == 0
matcher = CompileThreads(1).run(llguidance.LLMatcher, tokenizer, grammar, timeout=120)
assert not matcher.is_error() and threading.stack_size() == 0
print("compiled")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "compiled" in result.stdout, (result.returncode, result.stderr[-2000:])


def _row(matcher) -> SamplingRow:
    return SamplingRow(SamplingParams(), [1], [], 0, (EOS,), grammar=matcher)


def test_a_matcher_that_fails_mid_output_is_seen_before_the_worker_takes_it(compiler, smollm2_tokenizer):
    """A dead end after "a" puts the matcher in its error state (its mask: EOS only). Under async
    scheduling ``start`` hands the matchers to the worker thread; it notes first which of those that
    sampled EOS are in error, and ``failure`` answers for them (a healthy one that ended: None)."""
    stuck = compiler.compile(StructuredOutputsParams(grammar='start: "a" x\nx: x'))
    done = compiler.compile(StructuredOutputsParams(choice=["a"]))
    a = smollm2_tokenizer.encode("a", add_special_tokens=False)
    for matcher in (stuck, done):
        assert matcher.consume_tokens(a)
    masks = GrammarMasks(VOCAB, torch.device("cpu"))
    try:
        rows = [_row(stuck), _row(done)]
        masks.finish_fill(masks.plan(rows))  # their masks after "a": EOS only, for both
        assert stuck.is_error() and not done.is_error()
        live = LiveTokens([(stuck, EOS), (done, EOS)])
        live.tokens = [EOS, EOS]
        pending = masks.plan(rows, tokens_known=False)
        masks.start(pending, live)
        assert id(stuck) in masks._failed and id(done) not in masks._failed  # noted before the job ran
        error = masks.failure(stuck)
        assert error and error.startswith("NoExtension")
        assert masks.failure(done) is None
        masks.finish_fill(pending)
        assert masks.failure(done) is None and masks.failure(stuck)  # now idle: asked directly
    finally:
        masks.close()
