"""Byte forwarders between network namespaces, for the real nodes of the local cluster.

The real nodes' addresses (their bridge, pod IPs, Service IPs) exist only inside network
namespaces the harness makes (:mod:`.netns`). What must cross that boundary is forwarded by
this small program, and only through loopback or a Unix socket:

* ``--listen-fd N --to HOST:PORT``: accept on an inherited listening socket (the harness made
  it inside whichever namespace it must serve) and connect to ``HOST:PORT`` from the namespace
  this process runs in. E.g. the API server on 127.0.0.1 offered to the nodes at 10.200.0.1,
  or a hub on a Service address offered to the host at 127.0.0.1.
* ``--listen-unix PATH --http-connect``: an HTTP CONNECT proxy on a Unix socket, the API
  server's egress to the nodes (kubelet logs, exec, port-forward): the API server runs on the
  host, the kubelets inside their namespaces.

Usage: ``python -m gpushare_hub.localcluster.forward --listen-fd 3 --to 127.0.0.1:6443``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys

CHUNK = 65536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One direction; at its end only that direction is shut (the reply may still come back)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    try:
        await asyncio.gather(_pipe(a[0], b[1]), _pipe(b[0], a[1]))
    finally:
        for writer in (a[1], b[1]):
            with contextlib.suppress(Exception):
                writer.close()


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


async def _forward_to(
    target: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        upstream = await asyncio.wait_for(asyncio.open_connection(*target), 10)
    except (OSError, TimeoutError) as err:
        print(f"forward: cannot reach {target[0]}:{target[1]}: {err}", file=sys.stderr, flush=True)
        writer.close()
        return
    await _splice((reader, writer), upstream)


async def _http_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One CONNECT request (``CONNECT host:port HTTP/1.1`` and headers), then raw bytes."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        if method != "CONNECT":
            raise ValueError(f"method {method}")
        host, port = _split(target)
    except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as err:
        writer.write(f"HTTP/1.1 400 Bad Request\r\n\r\nonly CONNECT host:port ({err})\n".encode())
        writer.close()
        return
    try:
        upstream = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
    except (OSError, TimeoutError) as err:
        writer.write(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{host}:{port}: {err}\n".encode())
        writer.close()
        return
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await writer.drain()
    await _splice((reader, writer), upstream)


async def serve(args: argparse.Namespace) -> None:
    if args.http_connect:
        server = await asyncio.start_unix_server(_http_connect, path=args.listen_unix)
    else:
        target = _split(args.to)
        sock = socket.socket(fileno=args.listen_fd)
        server = await asyncio.start_server(lambda r, w: _forward_to(target, r, w), sock=sock)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpushare_hub.localcluster.forward", description=__doc__)
    p.add_argument("--listen-fd", type=int, help="an inherited listening TCP socket")
    p.add_argument("--to", help="HOST:PORT to connect to, from this process's namespace")
    p.add_argument("--listen-unix", help="a Unix socket path to serve on (with --http-connect)")
    p.add_argument("--http-connect", action="store_true", help="serve HTTP CONNECT on --listen-unix")
    args = p.parse_args(argv)
    if args.http_connect != bool(args.listen_unix) or (
        not args.http_connect and not (args.to and args.listen_fd)
    ):
        p.error("give --listen-fd and --to, or --listen-unix with --http-connect")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
