"""Is the HTTP client still taking the stream? The TCP connection tells, when the server is on Linux.

A streaming response's writer (the SSE generator) takes every delta as soon as the socket accepts
bytes, and the kernel accepts megabytes (the send buffer autotunes up to ``tcp_wmem``, ~4 MB) after
the client stopped reading. The engine's stall limit, counted at the writer, would start only once
all of that is full: 74 s after the client stopped on an n=64 stream, never on an n=1 stream that
ends sooner. The peer's TCP receive window is the first place the sender can see it: the right
edge of the window (bytes acknowledged + window advertised) advances while the client's stack
takes data, and stops once the client's receive buffer is full. While bytes wait in our send
queue and that edge stands still, the client is taking nothing.

What the client's kernel buffered before its window closed (about 128 KB for a default Linux
client that stopped early) cannot be seen from here by any means: the stall clock starts when the
client's stack stops accepting, which is the earliest moment a server can know.

The ASGI scope names the connection by its addresses only; its socket is found among the
process's descriptors (``/proc/self/fd``) and used without taking ownership: every sample checks
that the descriptor still is that connection. The search waits for the probe's first sample (the
engine's watchdog, off the request's path): a burst of new streams then costs one scan of the
descriptors per watchdog round. Searching when each request came in made every new connection a
miss and a scan of every open socket, 11.6 ms each with 256 connections open on the CI CPU
(benchmarks/probes/request_ingest.py), paid on the event loop by every request of a burst. Elsewhere than
Linux, ``probe_for`` returns None and the engine's own stall limit (at the writer) is all there is.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from typing import Optional

_FD_DIR = "/proc/self/fd"
# struct tcp_info (linux/tcp.h): offsets of the fields read here.
_NOTSENT_BYTES = 144  # u32: bytes queued that were never sent (Linux >= 4.6)
_BYTES_ACKED = 120  # u64: bytes the peer acknowledged
_SND_WND = 228  # u32: the peer's advertised receive window, in bytes (Linux >= 5.4)
_INFO_SIZE = 232
_SAMPLE_PERIOD = 0.2  # seconds; the engine's watchdog asks every 0.25 s at most


class ClientStallProbe:
    """``probe(now)`` -> since when (``time.monotonic()``) the client has taken nothing while bytes
    waited for it, or None while it keeps up. One per HTTP response, shared by its choices."""

    __slots__ = ("_fd", "_family", "_peer", "_local", "_edge", "_progress_at", "_sampled_at", "_since")

    def __init__(self, peer: tuple, local: tuple) -> None:
        self._fd: Optional[int] = None  # found at the first sample (``_resolve``); -1: not found
        self._family = 0
        self._peer = peer
        self._local = local
        self._edge = -1  # right edge of the peer's window at the last sample
        self._progress_at = 0.0  # when the edge last moved (or nothing waited)
        self._sampled_at = -1.0
        self._since: Optional[float] = None

    def _resolve(self) -> bool:
        if self._fd is None:
            found = _SOCKETS.find(self._peer, self._local)
            self._fd, self._family = found if found is not None else (-1, 0)
        return self._fd >= 0

    def __call__(self, now: float) -> Optional[float]:
        if now - self._sampled_at < _SAMPLE_PERIOD:
            return self._since
        self._sampled_at = now
        info = self._tcp_info() if self._resolve() else None
        if info is None:  # gone (the ASGI server notices the disconnect itself) or unreadable
            self._since = None
            return None
        (notsent,) = struct.unpack_from("I", info, _NOTSENT_BYTES)
        (acked,) = struct.unpack_from("Q", info, _BYTES_ACKED)
        (window,) = struct.unpack_from("I", info, _SND_WND)
        edge = acked + window
        if edge != self._edge or notsent == 0:
            self._edge = edge
            self._progress_at = now
            self._since = None
        else:
            self._since = self._progress_at
        return self._since

    def on_stalled(self) -> None:
        """The engine aborted the request for this stall: close the connection (both ways), so that
        the response's blocked write fails and the ASGI server frees the connection, as a write timeout
        would, instead of holding it and its send buffer until the client comes back."""
        if not self._resolve():
            return
        with _borrowed(self._fd, self._family) as sock:
            if sock is not None and _connection(sock) == (self._peer, self._local):
                sock.shutdown(socket.SHUT_RDWR)

    def _tcp_info(self) -> Optional[bytes]:
        with _borrowed(self._fd, self._family) as sock:
            if sock is None or _connection(sock) != (self._peer, self._local):
                return None  # closed, or closed and its number reused by another connection or file
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_SIZE)
            return info if len(info) >= _INFO_SIZE else None
        return None  # an OSError inside: the connection went away between two calls


def probe_for(scope: dict) -> Optional[ClientStallProbe]:
    """A probe of the TCP connection an ASGI HTTP request came in on, or None where none can be had."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "TCP_INFO"):
        return None
    client, server = scope.get("client"), scope.get("server")
    if not client or not server:
        return None  # a Unix socket, or an in-process test client
    if not os.path.isdir(_FD_DIR):
        return None
    return ClientStallProbe((str(client[0]), int(client[1])), (str(server[0]), int(server[1])))


class _SocketIndex:
    """(peer, local) address -> (descriptor, family) of the process's TCP sockets, rebuilt on a miss:
    a burst of new streams costs one scan of the descriptors, not one each."""

    def __init__(self) -> None:
        self._index: dict[tuple, tuple[int, int]] = {}
        self._unusable = False

    def find(self, peer: tuple, local: tuple) -> Optional[tuple[int, int]]:
        if self._unusable:
            return None
        key = (peer, local)
        hit = self._index.get(key)
        if hit is not None and _addresses(*hit) == key:
            return hit
        self._rebuild()
        return self._index.get(key)

    def _rebuild(self) -> None:
        try:
            names = os.listdir(_FD_DIR)
        except OSError:
            self._unusable = True  # no /proc: never look again
            return
        index = {}
        for name in names:
            try:
                fd = int(name)
                if not os.readlink(f"{_FD_DIR}/{name}").startswith("socket:"):
                    continue
                sock = socket.socket(fileno=fd)  # the family and type are read from the descriptor
            except (ValueError, OSError):
                continue
            family, kind = sock.family, sock.type
            sock.detach()
            if kind == socket.SOCK_STREAM and family in (socket.AF_INET, socket.AF_INET6):
                key = _addresses(fd, family)
                if key is not None:
                    index[key] = (fd, family)
        self._index = index


def _addresses(fd: int, family: int) -> Optional[tuple]:
    """(peer, local) of the connected socket ``fd`` of a known family, else None."""
    with _borrowed(fd, family) as sock:
        if sock is not None:
            return _connection(sock)
    return None


class _borrowed:
    """``with _borrowed(fd, family) as sock``: a socket object over a descriptor the ASGI server owns,
    detached (never closed) on the way out; ``sock`` is None when the descriptor is no longer open.
    Every ``OSError`` inside is swallowed: the connection can go at any moment (the client resets it,
    the server closes it), and what this module reads is information, never a reason to fail; the
    engine's watchdog calls it, and an error raised there would end the engine."""

    __slots__ = ("_sock", "_fd", "_family")

    def __init__(self, fd: int, family: int) -> None:
        self._fd, self._family, self._sock = fd, family, None

    def __enter__(self) -> Optional[socket.socket]:
        try:  # a closed descriptor raises here already (EBADF)
            self._sock = socket.socket(self._family, socket.SOCK_STREAM, 0, self._fd)
        except OSError:
            self._sock = None
        return self._sock

    def __exit__(self, kind, error, tb) -> bool:
        if self._sock is not None:
            self._sock.detach()
        return kind is not None and issubclass(kind, OSError)


def _connection(sock: socket.socket) -> tuple:
    """(peer, local) addresses of a connected socket (raises OSError when it is not one)."""
    return _address(sock.getpeername()), _address(sock.getsockname())


def _address(addr) -> tuple:
    if not isinstance(addr, tuple):  # the number now names a Unix socket: not a TCP connection
        raise OSError("not an internet socket")
    return str(addr[0]), int(addr[1])


_SOCKETS = _SocketIndex()
