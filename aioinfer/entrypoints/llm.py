"""The offline API, mirroring vLLM's ``LLM``: a common vLLM script runs unchanged."""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from aioinfer.config import EngineConfig
from aioinfer.engine.engine_core import EngineCore
from aioinfer.engine.input_processor import InputProcessor, PromptInput, prompt_salt
from aioinfer.engine.output_processor import OutputProcessor
from aioinfer.entrypoints.chat_content import content_text
from aioinfer.entrypoints.chat_tools import render_with_tools
from aioinfer.outputs import RequestOutput
from aioinfer.request import RequestStatus
from aioinfer.sampling_params import SamplingParams
from aioinfer.utils.gc_deferral import full_collections_deferred

if TYPE_CHECKING:  # prometheus_client is the serve extra's: imported only when metrics are read
    from aioinfer.metrics_reader import Metric

_GENERATION_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


class LLM:
    """``LLM(model=..., dtype=..., max_model_len=..., block_size=..., num_kv_blocks=..., ...)``.

    Keyword arguments are the fields of ModelConfig, CacheConfig and SchedulerConfig plus
    ``device`` and ``attention_backend``, and vLLM's common options (vllm_options.py: renamed,
    accepted without effect, or a ValueError naming what is not supported); unknown ones raise TypeError.
    """

    def __init__(self, model: Optional[str] = None, **kwargs: Any) -> None:
        from aioinfer.fetch import DEFAULT_MODEL

        self.config = EngineConfig.from_kwargs(model or DEFAULT_MODEL, **kwargs)
        if self.config.parallel.data_parallel_size > 1:
            raise ValueError("the offline LLM runs one replica; data parallelism is aioinfer.DataParallelEngine's")
        self.engine = EngineCore(self.config)
        loaded = self.engine.loaded
        self.tokenizer = loaded.tokenizer
        self.inputs = InputProcessor(loaded.tokenizer, loaded.arch.vocab_size, loaded.max_model_len,
                                     loaded.eos_token_ids, seed=self.config.model.seed,
                                     max_logprobs=self.config.model.max_logprobs,
                                     grammar_limits=self.engine.grammar_limits)
        self._ids = itertools.count()
        self._metrics = _offline_metrics(self.config.model.model)  # None without prometheus_client
        if self._metrics is not None:
            self._metrics.prometheus.set_cache_config(0, self.engine.cache_config_info)

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes, if any (a no-op otherwise). Idempotent;
        also done when the LLM is garbage-collected, but only an explicit call is prompt."""
        self.engine.shutdown()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block (vLLM's); False while a request holds blocks. With
        ``kv_events_config`` subscribers hear ``AllBlocksCleared``."""
        return self.engine.reset_prefix_cache()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def get_metrics(self) -> list[Metric]:
        """vLLM's offline metrics: one ``aioinfer.metrics_reader`` Counter, Gauge, Histogram or Vector per
        series of every ``vllm:`` family (tokens, requests by finish reason, TTFT, inter-token and
        end-to-end latency, running / waiting requests, KV-cache usage, ...) over every ``generate``
        and ``chat`` call of this LLM so far, as the server's ``/metrics`` would show them.

        Recorded always (vLLM records them only with ``disable_log_stats=False``); needs
        prometheus_client (the ``serve`` extra)."""
        if self._metrics is None:
            raise RuntimeError("LLM.get_metrics() needs prometheus_client: pip install 'aioinfer[serve]'")
        return self._metrics.read()

    def get_tokenizer(self):
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults, as vLLM does."""
        defaults = self.engine.loaded.generation_defaults
        return SamplingParams(**{k: defaults[k] for k in _GENERATION_DEFAULT_KEYS if defaults.get(k) is not None})

    def generate(
        self,
        prompts: Union[PromptInput, Sequence[PromptInput]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: bool = True,
        priority: Optional[Sequence[int]] = None,
        cache_salt: Union[str, Sequence[Optional[str]], None] = None,
    ) -> list[RequestOutput]:
        """``priority``: one per prompt, lower runs first. ``cache_salt``: one for all prompts or one
        per prompt; only prompts with equal salts share prefix-cache blocks (tenant isolation)."""
        # No full collection of the start-up heap while the call runs (230-270 ms each on the H200
        # host, about once a workload-1 run; utils/gc_deferral.py). The whole call, not only its step
        # loop: the one held back by the call before would otherwise come while this one tokenizes.
        with full_collections_deferred():
            return self._generate(prompts, sampling_params, use_tqdm, priority, cache_salt)

    def _generate(self, prompts, sampling_params, use_tqdm: bool, priority, cache_salt) -> list[RequestOutput]:
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(f"got {len(prompt_list)} prompts but {len(params_list)} sampling params")
        if priority is not None and len(priority) != len(prompt_list):
            raise ValueError(f"got {len(prompt_list)} prompts but {len(priority)} priorities")
        if cache_salt is None or isinstance(cache_salt, str):
            salts = [cache_salt] * len(prompt_list)
        else:
            salts = list(cache_salt)
            if len(salts) != len(prompt_list):
                raise ValueError(f"got {len(prompt_list)} prompts but {len(salts)} cache salts")
        # Validate and tokenize everything before anything is queued: a bad prompt queues nothing.
        prepared = []
        for prompt, params, salt in zip(prompt_list, params_list, salts):
            text, ids = self.inputs.tokenize(prompt)
            if text is None and isinstance(prompt, dict):
                text = prompt.get("prompt")  # a TokensPrompt may carry the text its ids stand for
            prepared.append((text, ids, params, prompt_salt(prompt, salt)))
        return self._run(prepared, use_tqdm, priority)

    def chat(
        self,
        messages: Union[list[dict], list[list[dict]]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: bool = True,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        tools: Optional[list[dict]] = None,
        continue_final_message: bool = False,
        chat_template_kwargs: Optional[dict[str, Any]] = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the tokenizer's chat template.

        A message's ``content`` may be a string or a list of ``{"type": "text", "text": ...}`` parts
        (joined with newlines, as the server does); other part types raise ValueError naming them.
        ``tools`` (OpenAI's function definitions) go through the chat template, as in vLLM (or, for a
        template that ignores them, a system message: the server's rule); the reply is text (the server
        parses tool calls out of it: entrypoints/openai/tool_calls.py). ``continue_final_message``: the
        last (assistant) message is left open and the reply continues it (needs
        ``add_generation_prompt=False``); ``chat_template_kwargs``: extra variables for the template."""
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message needs add_generation_prompt=False")
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer, so no chat template")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        conversations = [_text_messages(conv) for conv in conversations]  # all checked before any runs
        options = {**(chat_template_kwargs or {}), "add_generation_prompt": add_generation_prompt,
                   "continue_final_message": continue_final_message}
        prompts = [render_with_tools(self.tokenizer, conv, tools, chat_template=chat_template, **options)
                   for conv in conversations]
        # The template already holds the special tokens (BOS etc.): tokenize without adding more.
        token_lists = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        outputs = self.generate(token_lists, sampling_params, use_tqdm=use_tqdm)
        for output, prompt in zip(outputs, prompts):
            output.prompt = prompt
        return outputs

    def _run(self, prepared, use_tqdm: bool, priority: Optional[Sequence[int]]) -> list[RequestOutput]:
        core, processor, metrics = self.engine, OutputProcessor(self.tokenizer), self._metrics
        groups: list[tuple[str, Optional[str], list[int], list[str]]] = []
        requests = {}  # child id -> its Request (speculative decoding: its draft counts at the end)
        # Every constrained request's matcher, built side by side before any request is queued.
        matchers = iter(self.inputs.compile_ahead([params.structured_outputs for _, _, params, _ in prepared
                                                   if params.structured_outputs is not None
                                                   for _ in range(params.n)]))
        try:
            for i, (text, ids, params, salt) in enumerate(prepared):
                parent_id = str(next(self._ids))
                child_ids = []
                for index in range(params.n):
                    child_params = params.clone()
                    child_params.n = 1
                    if params.seed is not None:
                        child_params.seed = params.seed + index  # distinct, reproducible samples
                    child_id = parent_id if params.n == 1 else f"{parent_id}-{index}"
                    request = self.inputs.make_request(
                        child_id, ids, child_params, priority=priority[i] if priority else 0, cache_salt=salt,
                        grammar=next(matchers) if child_params.structured_outputs is not None else None)
                    core.add_request(request)
                    if metrics is not None:
                        metrics.add_request(child_id, len(ids), time.monotonic())
                    requests[child_id] = request
                    processor.add_request(child_id, text, ids, child_params)
                    child_ids.append(child_id)
                groups.append((parent_id, text, ids, child_ids))

            progress = _progress(len(groups), use_tqdm)
            remaining = {child: parent for parent, _, _, children in groups for child in children}
            open_children = {parent: len(children) for parent, _, _, children in groups}
            while core.has_unfinished():
                step_start = time.monotonic()
                scheduler_output, runner_output, core_outputs = core.step_with_details()
                deltas, stopped = processor.process(core_outputs)
                if stopped:
                    core.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
                if metrics is not None:
                    metrics.record_step(core, scheduler_output, runner_output, core_outputs, deltas, step_start)
                for delta in deltas:
                    if delta.finish_reason is not None and delta.request_id in remaining:
                        parent = remaining.pop(delta.request_id)
                        open_children[parent] -= 1
                        if open_children[parent] == 0 and progress is not None:
                            progress.update(1)
            if progress is not None:
                progress.close()
        except BaseException:
            # Nothing may stay queued or hold KV blocks after a failure or Ctrl-C.
            core.finish_requests([c for _, _, _, children in groups for c in children])
            if metrics is not None:
                metrics.abandon()
            try:
                core.drain()
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
            raise

        results = []
        speculative = core.scheduler.draft_policy is not None
        for parent_id, text, ids, children in groups:
            outputs = [processor.completion(child, index) for index, child in enumerate(children)]
            # Speculative decoding: the draft tokens verified for the request's choices, and of those the accepted.
            metrics = {"num_draft_tokens": sum(requests[c].num_draft_tokens_total for c in children),
                       "num_accepted_tokens": sum(requests[c].num_accepted_tokens_total for c in children)
                       } if speculative else {}
            results.append(RequestOutput(request_id=parent_id, prompt=text, prompt_token_ids=ids,
                                         outputs=outputs, finished=True,
                                         num_cached_tokens=max(processor.num_cached_tokens(c) for c in children),
                                         metrics=metrics))
        return results


def _offline_metrics(model: str):
    from importlib.util import find_spec

    if find_spec("prometheus_client") is None:  # the serve extra's: the offline engine runs without it
        return None
    from aioinfer.entrypoints.llm_metrics import OfflineMetrics

    return OfflineMetrics(model)


def _text_messages(conversation: list[dict]) -> list[dict]:
    # Templates concatenate content as a string: lists of parts become one (the server's rule too).
    return [{**m, "content": content_text(m["content"], f"message {i}, ")} if "content" in m else m
            for i, m in enumerate(conversation)]


def _as_prompt_list(prompts) -> list[PromptInput]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [prompts]  # a single token-id list
    return prompts


def _progress(total: int, enabled: bool):
    if not enabled or total < 2:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
