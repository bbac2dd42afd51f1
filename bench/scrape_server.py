#!/usr/bin/env python3
"""What the metrics' HTTP server costs, and whether a slow client holds it
(module_utils/agent/scrape_server.py, docs/monitoring.md), side by side in one run with the server of
before: the standard library's one-thread http.server, whose handler waits 10 s for each read.

Each server runs in a child process of its own on loopback and serves the same 5 KB body (a CT's
metrics are about that size). Measured for each:
- the CPU time (user + system, getrusage of the child) of SCRAPES scrapes back to back, per scrape;
- its CPU time while idle for IDLE_S seconds (between scrapes the server only waits);
- a scrape's wall time while SLOW clients hold connections open, each having sent one byte.

Usage: .venv/bin/python bench/scrape_server.py  (BENCH_SCRAPES=2000, BENCH_SLOW=5: the server of before takes
10 s a slow client)
"""

import http.server
import os
import resource
import socket
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import testlib  # noqa: E402,F401  (the collection on the import path)

from ansible_collections.dflash.lifecycle.plugins.module_utils.agent import scrape_server  # noqa: E402

BODY = b"".join(b"dflash_metric_%d{state=\"watching\"} %d.0\n" % (i, i) for i in range(160))[:5000]
SCRAPES = int(os.environ.get("BENCH_SCRAPES", "2000"))
SLOW = int(os.environ.get("BENCH_SLOW", "5"))
IDLE_S = 3.0


def serve_before(listener):
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 10  # REQUEST_TIMEOUT_S of the server of before

        def do_GET(self):  # noqa: N802  (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(listener.getsockname(), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = listener
    server.serve_forever(poll_interval=3600)


def serve_now(listener):
    scrape_server.ScrapeServer(listener, lambda method, path: (200, BODY, "text/plain; version=0.0.4")).serve_forever()


def start(serve):
    """(pid, port, a pipe that gives its CPU seconds on request) of a child serving with serve."""
    listener = socket.create_server(("127.0.0.1", 0))
    asks, answers = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        import threading

        def report():
            while os.read(asks[0], 1):
                usage = resource.getrusage(resource.RUSAGE_SELF)
                os.write(answers[1], f"{usage.ru_utime + usage.ru_stime:.6f}\n".encode())

        threading.Thread(target=report, daemon=True).start()
        serve(listener)
        os._exit(0)
    port = listener.getsockname()[1]
    listener.close()
    return pid, port, (asks[1], answers[0])


def cpu(pipes):
    os.write(pipes[0], b"?")
    return float(os.read(pipes[1], 64).decode())


def scrape(port, timeout=60):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as page:
        assert page.read() == BODY


def measure(name, serve):
    pid, port, pipes = start(serve)
    try:
        scrape(port)
        before = cpu(pipes)
        for _ in range(SCRAPES):
            scrape(port)
        per_scrape_us = (cpu(pipes) - before) / SCRAPES * 1e6
        before = cpu(pipes)
        time.sleep(IDLE_S)  # the idle cost is what this measures: nothing to wait for
        idle_ms = (cpu(pipes) - before) * 1000
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(SLOW)]
        for client in slow:
            client.sendall(b"G")
        began = time.monotonic()
        try:
            scrape(port, timeout=SLOW * 10 + 30)
            held_s = f"{time.monotonic() - began:.3f}"
        except OSError as err:
            held_s = f"failed ({err})"
        for client in slow:
            client.close()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    print(f"{name:<28}{per_scrape_us:>18.1f}{idle_ms:>16.2f}   {held_s}")
    return per_scrape_us


def main():
    print(f"{SCRAPES} scrapes of {len(BODY)} bytes, {IDLE_S:.0f} s idle, {SLOW} clients that sent one byte each")
    print(f"{'server':<28}{'CPU us / scrape':>18}{'idle CPU ms':>16}   a scrape's wall (s) beside the slow clients")
    before = measure("http.server (before)", serve_before)
    now = measure("ScrapeServer (now)", serve_now)
    print(f"CPU per scrape, now / before: {now / before:.2f}")


if __name__ == "__main__":
    main()
