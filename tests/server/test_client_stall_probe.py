"""The client-stall probe finds its connection's socket at its first sample, not when the request
comes in (a burst of new requests would otherwise scan the process's descriptors once each)."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from aioinfer.entrypoints.openai import client_stall

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO and /proc are Linux's")


def test_the_socket_is_found_at_the_first_sample_and_a_reader_is_not_stalled(monkeypatch):
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    index = client_stall._SocketIndex()
    monkeypatch.setattr(client_stall, "_SOCKETS", index)
    scans = []
    real_rebuild = index._rebuild
    monkeypatch.setattr(index, "_rebuild", lambda: scans.append(1) or real_rebuild())
    try:
        local, peer = served.getsockname(), served.getpeername()
        scope = {"client": peer, "server": local}
        probes = [client_stall.probe_for(scope) for _ in range(50)]  # a burst: no scan yet
        assert scans == []
        served.sendall(b"x" * 1000)
        client.recv(1000)  # the client keeps up
        now = time.monotonic()
        assert probes[0](now) is None
        assert len(scans) == 1 and probes[0]._fd == served.fileno()
        assert all(p(now) is None for p in probes[1:])
        assert len(scans) == 1, "one scan of the descriptors served the whole burst"
        assert all(p._fd == served.fileno() for p in probes)
    finally:
        for s in (client, served, listener):
            s.close()


def test_a_connection_that_is_gone_before_the_first_sample_gives_no_answer():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    scope = {"client": served.getpeername(), "server": served.getsockname()}
    probe = client_stall.probe_for(scope)
    for s in (client, served, listener):
        s.close()
    assert probe(time.monotonic()) is None
    probe.on_stalled()  # nothing to close: no error


def test_a_descriptor_closed_after_the_first_sample_gives_no_answer_and_never_raises():
    # The engine's watchdog samples the probe; the ASGI server may close the connection between two
    # samples (a client that reset it). Reading a closed descriptor must be "no information".
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    probe = client_stall.probe_for({"client": served.getpeername(), "server": served.getsockname()})
    try:
        assert probe(time.monotonic()) is None and probe._fd == served.fileno()
        served.close()  # the number is free now
        assert probe(time.monotonic() + 1) is None
        probe.on_stalled()
    finally:
        for s in (client, served, listener):
            s.close()


def test_a_descriptor_reused_by_another_connection_is_not_read_or_closed():
    listener = socket.create_server(("127.0.0.1", 0))
    first = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    probe = client_stall.probe_for({"client": served.getpeername(), "server": served.getsockname()})
    others = []
    try:
        assert probe(time.monotonic()) is None
        fd = served.fileno()
        served.close()
        first.close()
        while True:  # connect until the freed number is taken by a newer connection
            other = socket.create_connection(listener.getsockname())
            accepted, _ = listener.accept()
            others += [other, accepted]
            if accepted.fileno() == fd or len(others) > 40:
                break
        assert accepted.fileno() == fd
        accepted.sendall(b"x" * 100)
        assert probe(time.monotonic() + 1) is None  # not the newer connection's state
        probe.on_stalled()  # must not cut the newer connection
        assert other.recv(100) == b"x" * 100
        accepted.sendall(b"still open")
        assert other.recv(100) == b"still open"
    finally:
        for s in (listener, *others):
            s.close()
