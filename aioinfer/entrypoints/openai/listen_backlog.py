"""A listen backlog that takes a burst of arrivals (``listen_backlog``, default 2048).

hypercorn listens with a backlog of 100 unless told otherwise (``--backlog``). When more clients
connect at once than that, Linux drops the excess handshakes (``ListenOverflows`` in
/proc/net/netstat) and each of those clients retries after its initial retransmission timeout, one
second: 256 simultaneous streaming clients on a CPU server lost 10 handshakes so, and their time to
first token carried the extra second (CPU, 2026-12-01). uvicorn, under vLLM's server, listens
with 2048. ``hypercorn aioinfer.app:app`` gives the app no say in how hypercorn listens, and its
worker only listens after the app's start-up (asyncio's ``create_server`` calls ``listen(100)``). So
at start-up the app notes the TCP sockets that are bound but not listening yet, and once each
listens, calls ``listen`` on it again with the larger backlog (Linux takes a new backlog on a
listening socket; the kernel caps it at ``net.core.somaxconn``). ``aioinfer serve`` passes it to
hypercorn's config as well.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Optional

logger = logging.getLogger("aioinfer.server")

LISTEN_BACKLOG = 2048
_POLL_S = 0.01  # how often a socket that is not listening yet is looked at again
_GIVE_UP_S = 30.0  # after this, sockets that never listened are not the HTTP server's


def raise_backlog_once_listening(backlog: int) -> None:
    """At the app's start-up, on its event loop: raise the backlog of every TCP socket of this process
    that listens now or starts listening within the next ``_GIVE_UP_S`` seconds."""
    pending = [fd for fd, listening in _tcp_server_sockets() if not _relisten_if(fd, listening, backlog)]
    if not pending:
        return
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + _GIVE_UP_S

    def check() -> None:
        nonlocal pending
        pending = [fd for fd in pending if _relisten_if(fd, _listening(fd), backlog) is False]
        if pending and loop.time() < give_up_at:
            loop.call_later(_POLL_S, check)

    loop.call_soon(check)


def _relisten_if(fd: int, listening: Optional[bool], backlog: int) -> Optional[bool]:
    """listen(backlog) on ``fd`` if it is listening; True once done, False if not yet, None if gone."""
    if not listening:
        return listening
    try:
        with _borrowed(fd) as sock:
            sock.listen(backlog)
    except OSError:
        return None
    logger.info("listen backlog: %d on %s", backlog, _address(fd))
    return True


def _tcp_server_sockets() -> list[tuple[int, bool]]:
    """(fd, listening) of this process's TCP sockets that are bound and not connected (Linux: /proc)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    found = []
    for name in names:
        try:
            with _borrowed(int(name)) as sock:
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                    continue
                if sock.getsockname()[1] == 0:
                    continue  # not bound
                try:
                    sock.getpeername()
                    continue  # a connection, not a server socket
                except OSError:
                    pass
                found.append((int(name), bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))))
        except (OSError, ValueError):
            continue  # not a socket, or closed meanwhile
    return found


def _listening(fd: int) -> Optional[bool]:
    try:
        with _borrowed(fd) as sock:
            return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:
        return None


def _address(fd: int) -> str:
    try:
        with _borrowed(fd) as sock:
            host, port = sock.getsockname()[:2]
            return f"{host}:{port}"
    except OSError:
        return f"fd {fd}"


class _borrowed:
    """A socket object over a descriptor someone else owns: detached, never closed, on exit."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)  # OSError if fd is not a socket

    def __enter__(self) -> socket.socket:
        return self._sock

    def __exit__(self, *exc_info) -> None:
        self._sock.detach()
