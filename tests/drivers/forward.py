#!/usr/bin/env python3
"""TCP forwarders for the hosts of tests/test_two_hosts.py, each host in a network namespace
of its own (tests/netns.py): `python forward.py LISTEN=TARGET ...`, LISTEN and TARGET as
host:port. Run inside a host's namespace, it makes the services the host uses answer on the
namespace's own 127.0.0.1 (what their addresses say, and what Kafka and HDFS advertise),
forwarded over the host's link; run in the root namespace, it takes what arrives over the
links to the services on the machine's 127.0.0.1.

Bytes are passed on as they come, each way, and an end of stream is passed on as one (a
half-close), so clients see the service's own behaviour. Nothing here times out: over a link
that is cut, a connection hangs as it would between machines, until the client or the kernel
gives up. Prints "ready" once every address listens; ends on SIGTERM. Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys

CHUNK = 256 * 1024


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy `reader` to `writer` until the end of the stream, then half-close `writer`."""
    while data := await reader.read(CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


async def serve(target: tuple[str, int], client_r, client_w) -> None:
    try:
        server_r, server_w = await asyncio.open_connection(*target)
    except OSError:
        client_w.transport.abort()  # what the client would see: a reset, not a polite close
        return
    for sock in (client_w.get_extra_info("socket"), server_w.get_extra_info("socket")):
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ways = [
        asyncio.ensure_future(pipe(client_r, server_w)),
        asyncio.ensure_future(pipe(server_r, client_w)),
    ]
    try:
        # Both ways to their end; a reset on either side resets the other.
        done, _ = await asyncio.wait(ways, return_when=asyncio.FIRST_EXCEPTION)
        if any(w.exception() for w in done if not w.cancelled()):
            client_w.transport.abort()
            server_w.transport.abort()
        await asyncio.gather(*ways, return_exceptions=True)
    finally:
        client_w.close()
        server_w.close()


def handler(target: tuple[str, int]):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve(target, reader, writer)

    return handle


async def main(routes: list[str]) -> None:
    servers = []
    for route in routes:
        listen, _, target = route.partition("=")
        servers.append(await asyncio.start_server(handler(address(target)), *address(listen)))
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
