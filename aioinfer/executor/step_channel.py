"""Rank 0's per-step message to the workers: one pickle, one write to a TCP socket per worker.

Not the gloo control group: every gloo collective hands its buffer to gloo's own thread and waits
for it, on both sides, and ``broadcast_object_list`` does two of them (sizes, then bytes) after a
pickle with the default protocol. Measured on CPU (2 processes, a decode SchedulerOutput, latency
from rank 0's call until the worker holds the object; ``benchmarks/probes/allreduce_latency.py --control``)
that path costs hundreds of microseconds, a socket write some tens (docs/distributed.md has the
numbers). The socket also never makes rank 0 wait: a message lands in the kernel's buffer and
rank 0 goes on to launch its own step.

The socket is a same-machine shortcut only: when the rendezvous host is not a loopback address
(ranks on other machines, ``env://`` with a real MASTER_ADDR), ``open_step_sender`` /
``open_step_receiver`` return the gloo broadcast instead, so that everything between machines goes
through torch.distributed.

Set-up rides on the control group: rank 0 listens on the rendezvous host (127.0.0.1 for spawned
workers, a loopback MASTER_ADDR for ``env://``), broadcasts the port and a random secret, and accepts exactly
one connection per worker that presents the secret (anything else that connects is dropped).
A worker whose peer is gone sees end-of-file and fails; rank 0 sees a broken pipe, or the next
collective breaks first.

Frames: an 8-byte little-endian length, then a pickle (highest protocol). The scheduler's slotted
dataclasses pickle through ``dataclasses``' generic ``__getstate__`` (a ``fields()`` call per
object); reducing them to (class, constructor arguments) makes pickling plus unpickling a
64-request decode step 1.6x faster (182 -> 113 us on a slow CPU).
"""

from __future__ import annotations

import copyreg
import dataclasses
import hmac
import io
import ipaddress
import operator
import os
import pickle
import socket
import struct
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from aioinfer.distributed.group import TPGroup

_HEADER = struct.Struct("<Q")
_SECRET_BYTES = 32


class GlooStepChannel:
    """The step message as a gloo broadcast over the control group (ranks on several machines)."""

    def __init__(self, group: TPGroup) -> None:
        self._group = group

    def send(self, obj: Any) -> None:
        self._group.broadcast_object(obj)

    def recv(self) -> Any:
        return self._group.broadcast_object(None)

    def close(self) -> None:
        pass


def same_machine(init_method: str) -> bool:
    """Whether every rank reaches rank 0 over loopback, i.e. all ranks run on this machine."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(rendezvous_host(init_method))).is_loopback
    except (OSError, ValueError):
        return False


def open_step_sender(group: TPGroup, init_method: str, timeout_s: float,
                     on_wait: Callable[[], None] = lambda: None) -> "StepSender | GlooStepChannel":
    """Rank 0's end of the step channel (collective with ``open_step_receiver`` on every worker)."""
    if same_machine(init_method):
        return StepSender(group, init_method, timeout_s, on_wait)
    return GlooStepChannel(group)


def open_step_receiver(group: TPGroup, init_method: str) -> "StepReceiver | GlooStepChannel":
    """A worker's end of the step channel; every rank decides alike from the same ``init_method``."""
    if same_machine(init_method):
        return StepReceiver(group, init_method)
    return GlooStepChannel(group)


class StepSender:
    """Rank 0's end: ``send`` one object to every worker, in order."""

    def __init__(self, group: TPGroup, init_method: str, timeout_s: float,
                 on_wait: Callable[[], None] = lambda: None) -> None:
        """Collective with every worker's ``StepReceiver``. ``on_wait`` runs about once a second
        while waiting for connections (rank 0 checks its workers are still alive there)."""
        secret = os.urandom(_SECRET_BYTES)
        with socket.create_server((rendezvous_host(init_method), 0), backlog=group.world_size) as listener:
            group.broadcast_object((listener.getsockname()[1], secret))
            self._socks = _accept(listener, secret, group.world_size - 1, timeout_s, on_wait)

    def send(self, obj: Any) -> None:
        data = dumps(obj)
        frame = _HEADER.pack(len(data)) + data
        for sock in self._socks:
            sock.sendall(frame)

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
        self._socks = []


class StepReceiver:
    """A worker's end: ``recv`` returns rank 0's objects in the order they were sent."""

    def __init__(self, group: TPGroup, init_method: str) -> None:
        port, secret = group.broadcast_object(None)
        self._sock = socket.create_connection((rendezvous_host(init_method), port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(secret)
        self._header = bytearray(_HEADER.size)

    def recv(self) -> Any:
        """Block until the next object (an idle engine may send nothing for hours)."""
        self._read_into(memoryview(self._header))
        (size,) = _HEADER.unpack(self._header)
        data = bytearray(size)
        self._read_into(memoryview(data))
        return pickle.loads(data)

    def close(self) -> None:
        self._sock.close()

    def _read_into(self, view: memoryview) -> None:
        while view:
            got = self._sock.recv_into(view, len(view), socket.MSG_WAITALL)
            if got == 0:
                raise ConnectionError("rank 0 closed the step channel")
            view = view[got:]


def rendezvous_host(init_method: str) -> str:
    """The host every rank reaches rank 0 at: the one in ``tcp://host:port``, or MASTER_ADDR (``env://``)."""
    url = urlparse(init_method)
    if url.scheme == "tcp" and url.hostname:
        return url.hostname
    if url.scheme == "env":
        return os.environ["MASTER_ADDR"]
    raise ValueError(f"tensor-parallel init method {init_method!r}: use tcp://host:port or env://")


def _accept(listener: socket.socket, secret: bytes, count: int, timeout_s: float,
            on_wait: Callable[[], None]) -> list[socket.socket]:
    accepted: list[socket.socket] = []
    deadline = time.monotonic() + timeout_s
    listener.settimeout(1.0)
    try:
        while len(accepted) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count - len(accepted)} tensor-parallel worker(s) did not connect "
                                   f"to the step channel within {timeout_s:.0f} s")
            on_wait()
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            sock.settimeout(10.0)  # a stray client must not hold rank 0 up
            try:
                presented = _read_exactly(sock, len(secret))
            except OSError:
                presented = b""
            if not hmac.compare_digest(presented, secret):
                sock.close()
                continue
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one small frame per step: no Nagle
            accepted.append(sock)
    except BaseException:
        for sock in accepted:
            sock.close()
        raise
    return accepted


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


# --------------------------------------------------------------------------- pickling

def _constructor_reducer(cls: type) -> Callable[[Any], tuple] | None:
    """(cls, field values) for a dataclass whose constructor takes every field and does nothing
    else; None for any other class (it keeps its default pickling)."""
    fields = dataclasses.fields(cls)
    if len(fields) < 2 or hasattr(cls, "__post_init__") or not all(f.init and not f.kw_only for f in fields):
        return None
    values = operator.attrgetter(*(f.name for f in fields))
    return lambda obj: (cls, values(obj))


def _dispatch_table() -> dict:
    from aioinfer.core import scheduler_output as so

    table = copyreg.dispatch_table.copy()
    for cls in (so.SchedulerOutput, so.ScheduledRequest, so.NewRequestData, so.SwapOut, so.SwapIn):
        reducer = _constructor_reducer(cls)
        if reducer is not None:
            table[cls] = reducer
    return table


_DISPATCH: dict | None = None


def dumps(obj: Any) -> bytes:
    global _DISPATCH
    if _DISPATCH is None:
        _DISPATCH = _dispatch_table()
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _DISPATCH
    pickler.dump(obj)
    return buffer.getvalue()
