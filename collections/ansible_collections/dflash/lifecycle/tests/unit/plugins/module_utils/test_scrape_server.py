"""module_utils/agent/scrape_server.py: no client holds the metrics' server - a scrape is answered
while clients that send nothing, or a byte at a time, hold connections; each connection ends at
its deadline; the server holds at most MAX_CONNECTIONS, closing the oldest. Real sockets on
loopback; the deadline's clock is the test's."""

import socket
import threading
import urllib.request

import pytest

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import scrape_server

BODY = b"dflash_run_up 1.0\n"


def respond(method, path):
    if path != "/metrics":
        return 404, b"no\n", "text/plain"
    return 200, BODY, "text/plain; version=0.0.4"


class Clock:
    def __init__(self):
        self.at = 1000.0

    def __call__(self):
        return self.at


@pytest.fixture
def server():
    listener = socket.create_server(("127.0.0.1", 0))
    clock = Clock()
    served = scrape_server.ScrapeServer(listener, respond, now=clock)
    served.clock, served.port = clock, listener.getsockname()[1]
    clients = []

    def connect(data=b""):
        client = socket.create_connection(("127.0.0.1", served.port), timeout=30)
        client.sendall(data)
        clients.append(client)
        return client

    served.connect = connect
    yield served
    for client in clients:
        client.close()
    for connection in list(served.connections.values()):
        served._close(connection)
    listener.close()


def until(server, condition, rounds=200):
    """Serve until condition holds: each round waits for the next event, never for a time."""
    for _round in range(rounds):
        if condition():
            return
        server.serve_once()
    raise AssertionError("the server never got there")


def closed(client):
    """Whether the server closed client's connection (what it sent first is read and dropped)."""
    client.settimeout(30)
    while True:
        try:
            data = client.recv(65536)
        except ConnectionResetError:
            return True
        if not data:
            return True


def test_a_scrape_is_answered_while_slow_clients_hold_more_connections_than_the_cap():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    served = scrape_server.ScrapeServer(listener, respond)
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    slow = []
    try:
        for index in range(scrape_server.MAX_CONNECTIONS + 4):
            client = socket.create_connection(("127.0.0.1", port), timeout=30)
            client.sendall(b"G" if index % 2 else b"")  # a byte of a request, or nothing at all
            slow.append(client)
        # the scrape comes after them all and is answered at once: http.server's one thread served
        # the first client until its 10 s timeout, then the next, and so on
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as page:
            assert page.status == 200 and page.read() == BODY
            assert page.headers["Content-Type"] == "text/plain; version=0.0.4"
    finally:
        for client in slow:
            client.close()
        listener.close()


def test_a_connection_ends_at_its_deadline_however_slowly_it_sends(server):
    dripping = server.connect(b"GET /met")
    until(server, lambda: len(server.connections) == 1)
    for _byte in b"rics HTTP/1.1\r\n":  # a byte now and then: each one is read, none extends the deadline
        dripping.sendall(bytes([_byte]))
        server.clock.at += 0.3
        server.serve_once()
    assert len(server.connections) == 1
    server.clock.at += scrape_server.REQUEST_DEADLINE_S
    server.serve_once()
    assert not server.connections and closed(dripping)


def test_at_the_cap_the_oldest_connection_is_closed_for_a_new_one(server):
    idle = [server.connect() for _index in range(scrape_server.MAX_CONNECTIONS)]
    until(server, lambda: len(server.connections) == scrape_server.MAX_CONNECTIONS)
    server.clock.at += 1
    scrape = server.connect(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    until(server, lambda: len(server.connections) < scrape_server.MAX_CONNECTIONS)
    assert closed(idle[0])
    reply = b""
    while not reply.endswith(BODY):
        reply += scrape.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close\r\n" in reply


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * scrape_server.REQUEST_BYTES + b"\r\n\r\n", b"431"),
    (b"\x16\x03\x01 a TLS hello\r\n\r\n", b"400"),
    (b"GET /other HTTP/1.1\r\n\r\n", b"404"),
])
def test_a_request_that_is_not_a_scrape_gets_its_status_and_the_connection_closed(server, request_bytes, status):
    client = server.connect(request_bytes)
    reply = b""

    def answered():
        nonlocal reply
        client.setblocking(False)
        try:
            reply += client.recv(65536)
        except BlockingIOError:
            pass
        except ConnectionResetError:
            return True
        return reply.count(b"\r\n\r\n") >= 1

    until(server, answered)
    assert reply.split(b" ")[1] == status and not server.connections
