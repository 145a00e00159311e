"""Network helpers."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` at the time of the call (``""``: on every interface), for a
    process group's rendezvous. Another process may take it before it is bound again."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
