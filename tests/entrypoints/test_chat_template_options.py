"""``continue_final_message`` and ``chat_template_kwargs`` offline (LLM.chat) and over HTTP: the
template sees them, the server answers as the offline engine, bad combinations are errors."""

from __future__ import annotations

import httpx
import pytest

from aioinfer import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8)
PARTIAL = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "My favourite colour is"}]
TEMPLATE = ("{% for m in messages %}{{ greeting }} {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    return LLM(model=str(smollm2_gguf), dtype="float32", device="cpu", max_model_len=512)


def test_offline_continue_final_message_leaves_the_reply_open(llm):
    tokenizer = llm.get_tokenizer()
    out = llm.chat(PARTIAL, GREEDY, add_generation_prompt=False, continue_final_message=True, use_tqdm=False)[0]
    expected = tokenizer.apply_chat_template(PARTIAL, tokenize=False, add_generation_prompt=False,
                                             continue_final_message=True)
    assert out.prompt == expected and expected.rstrip().endswith("My favourite colour is")
    closed = llm.chat(PARTIAL, GREEDY, add_generation_prompt=False, use_tqdm=False)[0]
    assert closed.prompt != out.prompt
    with pytest.raises(ValueError, match="add_generation_prompt"):
        llm.chat(PARTIAL, GREEDY, continue_final_message=True, use_tqdm=False)


def test_offline_chat_template_kwargs_reach_the_template(llm):
    out = llm.chat([{"role": "user", "content": "hi"}], GREEDY, chat_template=TEMPLATE,
                   chat_template_kwargs={"greeting": "Ahoy"}, use_tqdm=False)[0]
    assert out.prompt == "Ahoy user: hi\nassistant:"


def test_server_takes_both_as_vllm_does(smollm2_server, llm):
    url = smollm2_server.base_url + "/chat/completions"
    body = {"messages": PARTIAL, "max_tokens": 8, "temperature": 0, "add_generation_prompt": False,
            "continue_final_message": True, "chat_template_kwargs": {"enable_thinking": False}}
    answer = httpx.post(url, json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    offline = llm.chat(PARTIAL, GREEDY, add_generation_prompt=False, continue_final_message=True,
                       chat_template_kwargs={"enable_thinking": False}, use_tqdm=False)[0]
    assert answer.json()["choices"][0]["message"]["content"] == offline.outputs[0].text
    assert answer.json()["usage"]["prompt_tokens"] == len(offline.prompt_token_ids)
    assert "X-Aioinfer-Ignored-Fields" not in answer.headers
    both = httpx.post(url, json={**body, "add_generation_prompt": True}, timeout=120)
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    reserved = httpx.post(url, json={**body, "chat_template_kwargs": {"tools": []}}, timeout=120)
    assert reserved.status_code == 400 and reserved.json()["error"]["param"] == "chat_template_kwargs"


def test_server_chat_echo_prepends_the_assistant_message(smollm2_server, smollm2_client, llm):
    """vLLM's chat ``echo``: the reply starts with the last message's text when that message is the
    assistant's (streamed: one chunk of it right after the role); a user's last message is not echoed."""
    model = smollm2_client.models.list().data[0].id
    offline = llm.chat(PARTIAL, GREEDY, add_generation_prompt=False, continue_final_message=True,
                       use_tqdm=False)[0].outputs[0].text
    extra = {"echo": True, "add_generation_prompt": False, "continue_final_message": True}
    full = smollm2_client.chat.completions.create(model=model, messages=PARTIAL, max_tokens=8, temperature=0,
                                                  extra_body=extra)
    assert full.choices[0].message.content == PARTIAL[-1]["content"] + offline
    chunks = list(smollm2_client.chat.completions.create(model=model, messages=PARTIAL, max_tokens=8,
                                                         temperature=0, stream=True, extra_body=extra))
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert contents[0] == PARTIAL[-1]["content"] and "".join(contents) == full.choices[0].message.content
    question = PARTIAL[:1]
    plain = smollm2_client.chat.completions.create(model=model, messages=question, max_tokens=8, temperature=0)
    echoed = smollm2_client.chat.completions.create(model=model, messages=question, max_tokens=8, temperature=0,
                                                    extra_body={"echo": True})
    assert echoed.choices[0].message.content == plain.choices[0].message.content
