"""The server freezes its start-up objects out of the garbage collector once the engine is up
(entrypoints/openai/server_state.py): full collections then skip the model and tokenizer objects."""

from __future__ import annotations

import gc

import anyio
import pytest

from tiny_models import make_tiny_model_dir


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_objects_alive_when_the_engine_is_ready_are_frozen(tmp_path):
    from aioinfer.entrypoints.openai.api_server import create_app
    from aioinfer.server_config import ServerConfig

    model_dir = str(make_tiny_model_dir(tmp_path / "qwen2", arch="qwen2"))
    config = ServerConfig.from_env({"AIOINFER_MODEL": model_dir, "AIOINFER_DTYPE": "float32",
                                    "AIOINFER_DEVICE": "cpu", "AIOINFER_LOG_REQUESTS": "false"})
    app = create_app(config)
    gc.unfreeze()
    try:
        async with app.test_app() as test_app:
            state = app.extensions["aioinfer"]
            with anyio.fail_after(60):
                while not state.engine.is_ready:
                    await anyio.sleep(0.05)
            assert gc.get_freeze_count() > 0
            # Frozen objects sit in the permanent generation, which the collector (and get_objects) skips.
            collected = {id(o) for o in gc.get_objects()}
            assert gc.is_tracked(state.engine) and id(state.engine) not in collected
            response = await test_app.test_client().post(
                "/v1/completions", json={"model": state.served_model_name, "prompt": "Hi", "max_tokens": 3})
            assert response.status_code == 200  # serving goes on as before
    finally:
        gc.unfreeze()  # the rest of the test process collects as usual
