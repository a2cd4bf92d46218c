"""``--enable-ssl-refresh`` (vLLM's): the server's certificate, key and CA file are read again when
they change on disk, so that a renewed certificate is served without a restart.

hypercorn builds its ``SSLContext`` once, when it starts listening, and every new connection takes
its certificate from that context at the handshake: loading the new files into the same context
(``load_cert_chain``, ``load_verify_locations``) serves them to every connection opened afterwards,
while open connections keep the session they have. ``TLSConfig`` is hypercorn's ``Config`` keeping
the context it builds; ``refresh_certificates`` watches the files and reloads them into it.

The files are polled (their identity, size and modification time, once a second; vLLM watches them
through the watchfiles package, which aioinfer does not depend on: a few stat calls a second cost
nothing). A change is tried on a scratch context first: a certificate and key renewed in two writes
fail to load as a pair in between, and loading that half-renewed pair into the live context would
leave it serving a certificate without its key. Such a state is logged and retried at the next change.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from typing import Optional

from hypercorn.config import Config

logger = logging.getLogger(__name__)
POLL_SECONDS = 1.0


class TLSConfig(Config):
    """hypercorn's Config, keeping the SSLContext it creates for the listening sockets."""

    def __init__(self) -> None:
        super().__init__()
        self.ssl_contexts: list[ssl.SSLContext] = []

    def create_ssl_context(self) -> Optional[ssl.SSLContext]:
        context = super().create_ssl_context()
        if context is not None:
            self.ssl_contexts.append(context)
        return context


def _state(paths: list[str]) -> tuple:
    """What says a file changed: (inode, size, mtime) per path; None for one that is missing now."""
    def one(path: str):
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    return tuple(one(path) for path in paths)


def _load(context: ssl.SSLContext, certfile: str, keyfile: Optional[str], ca_certs: Optional[str]) -> None:
    context.load_cert_chain(certfile=certfile, keyfile=keyfile or certfile)
    if ca_certs:
        context.load_verify_locations(cafile=ca_certs)


async def refresh_certificates(config: TLSConfig, certfile: str, keyfile: Optional[str] = None,
                               ca_certs: Optional[str] = None, poll_seconds: float = POLL_SECONDS) -> None:
    """Until cancelled: whenever the files change, load them into every context ``config`` created
    (once they load as a pair). Owned by ``serve_cli.serve``, which cancels it when the server ends."""
    paths = [path for path in (certfile, keyfile, ca_certs) if path]
    seen = _state(paths)
    while True:
        await asyncio.sleep(poll_seconds)
        now = _state(paths)
        if now == seen:
            continue
        seen = now
        try:
            _load(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), certfile, keyfile, ca_certs)
        except (ssl.SSLError, OSError) as exc:
            logger.warning("TLS files changed but do not load (%s); still serving the previous certificate", exc)
            continue
        for context in config.ssl_contexts:
            _load(context, certfile, keyfile, ca_certs)
        logger.info("TLS certificate reloaded from %s", certfile)
