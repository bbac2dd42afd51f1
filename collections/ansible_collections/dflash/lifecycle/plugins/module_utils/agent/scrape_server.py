# Copyright: dflash-lifecycle contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The metrics' HTTP server (Python 3.8 compatible, the standard library only; docs/monitoring.md).

Anyone who reaches the CT's metrics port may connect, so no client can hold the server: one
thread, asleep in select() between scrapes as before, serves every connection side by side with
a deadline for the whole request - from its accept to the last byte of its answer - and a cap on
the connections it holds (the oldest is closed for a new one: a scraper's request comes at once
with its connection, a client that holds one open without a request is the one to drop). A
request is read up to its headers' end, at most REQUEST_BYTES; the answer says
``Connection: close``, as every answer of http.server's HTTP/1.0 default did.
"""

from __future__ import annotations

import selectors
import socket
import time

# a whole request, from its accept to its answer's last byte: Prometheus's scrape_timeout is 10 s
REQUEST_DEADLINE_S = 5.0
MAX_CONNECTIONS = 16
REQUEST_BYTES = 8192
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large"}


def answer(status, body, kind="text/plain; charset=utf-8"):
    head = (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("ascii") + body


def request_target(head):
    """(method, path) of a request's first line, or None when it is not an HTTP request line."""
    words = head.split(b"\r\n", 1)[0].split()
    if len(words) != 3 or not words[2].startswith(b"HTTP/"):
        return None
    return words[0].decode("ascii", "replace"), words[1].decode("ascii", "replace")


class Connection:
    def __init__(self, sock, deadline):
        self.sock, self.deadline = sock, deadline
        self.received, self.to_send = b"", None


class ScrapeServer:
    """Serves respond(method, path) -> (status, body, content type) on a listening socket, until
    the process ends."""

    def __init__(self, listener, respond, now=time.monotonic):
        self.listener, self.respond, self.now = listener, respond, now
        self.selector = selectors.DefaultSelector()
        self.connections = {}
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ)

    def serve_forever(self):
        while True:
            self.serve_once()

    def serve_once(self):
        """One wait for what comes next, until the nearest deadline (none while no client is
        connected), and what it brought."""
        timeout = None
        if self.connections:
            timeout = max(0.0, min(c.deadline for c in self.connections.values()) - self.now())
        for key, _events in self.selector.select(timeout):
            if key.fileobj is self.listener:
                self._accept()
            elif key.fd in self.connections:
                self._step(self.connections[key.fd])
        now = self.now()
        for connection in [c for c in self.connections.values() if c.deadline <= now]:
            self._close(connection)

    def _accept(self):
        while True:
            try:
                sock, _peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the client went before it was taken (ECONNABORTED), or no fd left
                return
            if len(self.connections) >= MAX_CONNECTIONS:
                self._close(min(self.connections.values(), key=lambda c: c.deadline))
            sock.setblocking(False)
            connection = Connection(sock, self.now() + REQUEST_DEADLINE_S)
            self.connections[sock.fileno()] = connection
            self.selector.register(sock, selectors.EVENT_READ)

    def _step(self, connection):
        try:
            if connection.to_send is None:
                self._read(connection)
            else:
                self._write(connection)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(connection)

    def _read(self, connection):
        data = connection.sock.recv(4096)
        if not data:
            self._close(connection)
            return
        connection.received += data
        end = connection.received.find(b"\r\n\r\n")
        if end < 0 and len(connection.received) <= REQUEST_BYTES:
            return
        target = request_target(connection.received) if 0 <= end <= REQUEST_BYTES else None
        if end < 0 or end > REQUEST_BYTES:
            reply = answer(431, b"the request's headers are too long\n")
        elif target is None:
            reply = answer(400, b"not an HTTP request\n")
        else:
            reply = answer(*self.respond(*target))
        connection.to_send = memoryview(reply)
        self.selector.modify(connection.sock, selectors.EVENT_WRITE)
        self._write(connection)

    def _write(self, connection):
        sent = connection.sock.send(connection.to_send)
        connection.to_send = connection.to_send[sent:]
        if not connection.to_send:
            self._close(connection)

    def _close(self, connection):
        self.connections.pop(connection.sock.fileno(), None)
        try:
            self.selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        try:
            connection.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        connection.sock.close()
