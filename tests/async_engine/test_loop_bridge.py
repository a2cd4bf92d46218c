"""LoopBridge: calls from a producer thread run on the event loop in order, without waiting for the
loop unless ``max_pending`` calls are queued; close() releases a blocked producer."""

from __future__ import annotations

import threading

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import pytest

from aioinfer.async_engine.loop_bridge import LoopBridge


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_calls_run_on_the_loop_in_order_and_coalesce():
    loop_thread = threading.get_ident()
    seen: list[tuple[int, int]] = []
    bridge = LoopBridge(anyio.lowlevel.current_token(), on_error=pytest.fail, max_pending=1000)

    def produce() -> None:
        for i in range(500):
            assert bridge.call(lambda x: seen.append((x, threading.get_ident())), i)

    await anyio.to_thread.run_sync(produce)
    with anyio.fail_after(5):
        while len(seen) < 500:
            await anyio.sleep(0.001)
    assert [x for x, _ in seen] == list(range(500))
    assert {thread for _, thread in seen} == {loop_thread}


@pytest.mark.anyio
async def test_producer_waits_only_when_max_pending_calls_are_queued():
    bridge = LoopBridge(anyio.lowlevel.current_token(), on_error=pytest.fail, max_pending=2)
    handled: list[int] = []
    third_queued = threading.Event()

    def produce() -> None:
        bridge.call(handled.append, 1)
        bridge.call(handled.append, 2)
        bridge.call(handled.append, 3)  # the queue is full: waits for the loop to drain
        third_queued.set()

    # Block the loop (no await) while the producer fills the queue: the third call cannot return.
    worker = threading.Thread(target=produce)
    worker.start()
    assert not third_queued.wait(0.3)
    assert handled == []
    with anyio.fail_after(5):
        while not third_queued.is_set():
            await anyio.sleep(0.001)  # the loop runs the drain, which frees room
        while handled != [1, 2, 3]:
            await anyio.sleep(0.001)
    worker.join(5)


@pytest.mark.anyio
async def test_close_releases_a_blocked_producer_and_drops_later_calls():
    bridge = LoopBridge(anyio.lowlevel.current_token(), on_error=pytest.fail, max_pending=1)
    results: list[bool] = []

    def produce() -> None:
        results.append(bridge.call(print, "first"))
        results.append(bridge.call(print, "second"))  # blocks: the loop is not running the drain

    worker = threading.Thread(target=produce)
    worker.start()
    worker.join(0.3)
    assert worker.is_alive()
    bridge.close()
    worker.join(5)
    assert not worker.is_alive()
    assert results == [True, False]
    assert bridge.call(print, "third") is False


@pytest.mark.anyio
async def test_a_failing_call_is_reported_and_the_next_ones_still_run():
    errors: list[BaseException] = []
    handled: list[int] = []
    bridge = LoopBridge(anyio.lowlevel.current_token(), on_error=errors.append)

    def fail(_):
        raise ValueError("boom")

    def produce() -> None:
        bridge.call(fail, None)
        bridge.call(handled.append, 1)

    await anyio.to_thread.run_sync(produce)
    with anyio.fail_after(5):
        while not handled:
            await anyio.sleep(0.001)
    assert [type(e) for e in errors] == [ValueError]


@pytest.mark.anyio
async def test_an_anyio_without_run_sync_soon_schedules_on_the_asyncio_loop_itself():
    import asyncio

    old_anyio_token = anyio.lowlevel.EventLoopToken(type("OldBackend", (), {}), asyncio.get_running_loop())
    bridge = LoopBridge(old_anyio_token, on_error=pytest.fail)
    handled: list[int] = []
    await anyio.to_thread.run_sync(lambda: [bridge.call(handled.append, i) for i in range(3)])
    with anyio.fail_after(5):
        while len(handled) < 3:
            await anyio.sleep(0.001)
    assert handled == [0, 1, 2]


def test_a_finished_loop_closes_the_bridge():
    async def grab_token():
        return anyio.lowlevel.current_token()

    token = anyio.run(grab_token)
    bridge = LoopBridge(token, on_error=pytest.fail)
    assert bridge.call(print, "late") is False
    assert bridge.call(print, "later") is False
