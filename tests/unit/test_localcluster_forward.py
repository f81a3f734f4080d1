"""The real nodes' forwarders (gpushare_hub.localcluster.forward), as processes on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

FORWARD = [sys.executable, "-m", "gpushare_hub.localcluster.forward"]


@pytest.fixture
def echo() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that sends back what it reads, upper-cased."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def _wait_connect(connect: object, timeout: float = 10) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return connect()  # type: ignore[operator,no-any-return]
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture
def forwarded(echo: int) -> Iterator[int]:
    """A forwarder process accepting on an inherited socket (its port) and connecting to ``echo``."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    proc = subprocess.Popen(
        [*FORWARD, f"--listen-fd={listener.fileno()}", f"--to=127.0.0.1:{echo}"],
        pass_fds=(listener.fileno(),),
    )
    listener.close()
    yield port
    proc.terminate()
    proc.wait(10)


def test_an_inherited_listening_socket_is_forwarded_to_the_target(forwarded: int) -> None:
    with _wait_connect(lambda: socket.create_connection(("127.0.0.1", forwarded), timeout=5)) as conn:
        conn.sendall(b"hello")
        assert conn.recv(100) == b"HELLO"


def _connect_request(sock_path: Path, request: bytes) -> tuple[socket.socket, bytes]:
    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(str(sock_path))
        return s

    conn = _wait_connect(connect)
    conn.sendall(request)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(1)
        if not chunk:
            break
        head += chunk
    return conn, head


def test_the_egress_proxy_answers_connect_and_refuses_anything_else(echo: int, tmp_path: Path) -> None:
    path = tmp_path / "egress.sock"
    proc = subprocess.Popen([*FORWARD, f"--listen-unix={path}", "--http-connect"])
    try:
        conn, head = _connect_request(path, f"CONNECT 127.0.0.1:{echo} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        with conn:
            assert head.startswith(b"HTTP/1.1 200 "), head
            conn.sendall(b"kubelet")
            assert conn.recv(100) == b"KUBELET"
        conn, head = _connect_request(path, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with conn:
            assert head.startswith(b"HTTP/1.1 400 "), head
            assert b"only CONNECT" in conn.recv(200)
        closed = socket.create_server(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()
        conn, head = _connect_request(path, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        with conn:
            assert head.startswith(b"HTTP/1.1 502 "), head
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_forwarder_refuses_half_a_command_line() -> None:
    proc = subprocess.run([*FORWARD, "--to=127.0.0.1:1"], capture_output=True, text=True)
    assert proc.returncode == 2 and "give --listen-fd and --to" in proc.stderr


def test_a_client_that_closes_its_sending_side_still_gets_the_reply(forwarded: int) -> None:
    with _wait_connect(lambda: socket.create_connection(("127.0.0.1", forwarded), timeout=5)) as conn:
        conn.sendall(b"half")
        conn.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := conn.recv(100):
            reply += chunk
        assert reply == b"HALF"
