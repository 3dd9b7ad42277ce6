"""rq-web's connection policy (SPEC S14.1, issue 13 D10): waitress's TCP server
that never stops accepting.

Plain waitress stops calling accept() once `connection_limit` connections are
open, so 1,000 half-open or idle connections lock every other client out until
they time out.  GuardedServer keeps accepting instead; when more than `limit`
connections are open it closes one that has no request in progress and no
answer still being sent, taken from the client address holding the most
connections, the one quiet the longest first.  A client that sends its
request at once is therefore always served, while whoever hoards connections
loses its own first.  Connections with a request running (a stream, a long
poll) are never closed here.
"""

from __future__ import annotations

import socket
from collections import Counter
from typing import Any

from waitress.adjustments import Adjustments
from waitress.server import TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

ACCEPT_BATCH = 256  # connections accepted per wake-up of the server loop
HEADROOM = ACCEPT_BATCH + 64  # waitress's own limit stays above ours: it never stops accepting


class GuardedServer(TcpWSGIServer):  # type: ignore[misc]
    limit = 1000

    def handle_accept(self) -> None:
        """Accept every pending connection (up to ACCEPT_BATCH: one poll() over a
        thousand sockets per accept would leave a burst waiting for seconds),
        then close idle ones down to the limit."""
        for _ in range(ACCEPT_BATCH):
            before = len(self.active_channels)
            super().handle_accept()
            if len(self.active_channels) == before:  # nothing pending (or it failed)
                break
        if len(self.active_channels) > self.limit:
            self.evict(len(self.active_channels) - self.limit)

    def evict(self, count: int) -> None:
        """Close `count` idle connections: the busiest client address's first, the
        one quiet the longest first among them."""
        channels = list(self.active_channels.values())
        per_addr = Counter(address_of(ch) for ch in channels)
        idle = [ch for ch in channels if not ch.requests and not ch.total_outbufs_len]
        idle.sort(key=lambda ch: (-per_addr[address_of(ch)], ch.last_activity))
        for channel in idle[:count]:
            channel.handle_close()


def address_of(channel: Any) -> str:
    addr = channel.addr
    return str(addr[0]) if isinstance(addr, tuple) else str(addr)


def guarded_server(app: Any, sock: socket.socket, connection_limit: int,
                   **adjustments: Any) -> GuardedServer:
    """What waitress.create_server builds for one listening socket, as a GuardedServer."""
    adj = Adjustments(sockets=[sock], connection_limit=connection_limit + HEADROOM,
                      **adjustments)
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    sockinfo = (sock.family, sock.type, sock.proto, sock.getsockname())
    server = GuardedServer(app, {}, True, sock, dispatcher=dispatcher, adj=adj,
                           bind_socket=False, sockinfo=sockinfo)
    server.limit = connection_limit
    return server
