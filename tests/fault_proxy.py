"""A TCP proxy between a Postgres client and server that can lose a `COMMIT`'s acknowledgement.

The fault it makes is the one a retry must survive: the client sent
`COMMIT`, the server committed, and the connection broke before the answer
came back, so the client cannot tell whether its transaction landed::

    async with FaultProxy("127.0.0.1", 5432) as proxy:
        db = Database(f"postgresql+asyncpg://root@127.0.0.1:{proxy.port}/test",
                      connect_args={"ssl": False})
        proxy.drop_after_commit()
        ...  # the next unit of work's COMMIT commits, and its caller gets an error

The proxy reads the frontend protocol (the client's side): a startup
message (an int32 length, then an int32 code, no type byte), then typed
messages (a type byte, then an int32 length that counts itself).  A
request for TLS or GSS encryption is refused here (`N`), so the stream
stays plaintext and readable; asyncpg then goes on in plaintext unless told
to require TLS (`connect_args={"ssl": False}` skips the request).  memorm
sends `COMMIT` as a simple query (`Q`), which is what is watched for.

Armed, the proxy forwards the next `COMMIT` to the server and closes the
client's side at once, before any answer.  It keeps reading the server's
side until the server has answered the `COMMIT` (`ReadyForQuery`), so that
when `dropped` is set the transaction is known to be committed, then closes
it too.  Everything else is passed through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

__all__ = ["FaultProxy"]

_ENCRYPTION_REQUESTS = (80877103, 80877104)  # SSLRequest, GSSENCRequest: answered "N" here
_READY = b"Z"  # ReadyForQuery: the server has finished answering a query


def _is_commit(body: bytes) -> bool:
    """Whether a simple query's body (its text and a NUL) is a `COMMIT`."""
    text = body.rstrip(b"\x00").decode("utf-8", "replace").strip().rstrip(";").strip()
    return text.upper() in ("COMMIT", "COMMIT TRANSACTION", "COMMIT WORK", "END")


class FaultProxy:
    """An asyncio proxy on `127.0.0.1:port` to the Postgres server at `host:port` (see the module).

    Use it as an async context manager; `port` is the proxy's own, chosen
    by the system.  `drop_after_commit(n)` arms it for the next `n`
    `COMMIT`s (of any connection); `dropped` counts the ones lost so far.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.server_port = port
        self.port = 0
        self.dropped = 0
        self._armed = 0
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._drop = asyncio.Event()

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def drop_after_commit(self, count: int = 1) -> None:
        """Lose the answer to the next `count` `COMMIT`s (each committed on the server)."""
        self._armed += count

    async def wait_dropped(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until `count` `COMMIT`s in all have been committed and their answers lost."""
        while self.dropped < count:
            self._drop.clear()
            await asyncio.wait_for(self._drop.wait(), timeout)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        try:
            server_reader, server_writer = await asyncio.open_connection(self.host, self.server_port)
        except OSError:
            client_writer.close()
            self._links.discard(task)
            return
        cut = asyncio.Event()  # set as a COMMIT goes out armed: the client hears nothing more
        try:
            upstream = asyncio.ensure_future(
                self._from_client(client_reader, client_writer, server_writer, cut)
            )
            downstream = asyncio.ensure_future(self._from_server(server_reader, client_writer, cut))
            await asyncio.wait([upstream, downstream], return_when=asyncio.FIRST_COMPLETED)
            if cut.is_set():  # the server's answer to the COMMIT is awaited (and thrown away)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(downstream), timeout=10)
            for pump in (upstream, downstream):
                pump.cancel()
            await asyncio.gather(upstream, downstream, return_exceptions=True)
        finally:
            for writer in (client_writer, server_writer):
                writer.close()
            self._links.discard(task)

    async def _from_client(
        self,
        reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        server_writer: asyncio.StreamWriter,
        cut: asyncio.Event,
    ) -> None:
        """Client -> server: the startup message, then typed messages, watched for an armed `COMMIT`."""
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:  # the startup phase: untyped messages
                head = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(head, "big") - 4)
                if int.from_bytes(body[:4], "big") in _ENCRYPTION_REQUESTS:
                    client_writer.write(b"N")  # no encryption: the stream stays readable
                    await client_writer.drain()
                    continue
                server_writer.write(head + body)  # a StartupMessage (or a CancelRequest)
                await server_writer.drain()
                break
            while True:
                head = await reader.readexactly(5)
                body = await reader.readexactly(int.from_bytes(head[1:], "big") - 4)
                if head[:1] == b"Q" and self._armed and _is_commit(body):
                    self._armed -= 1
                    cut.set()  # before the COMMIT leaves: no answer may reach the client
                    client_writer.close()
                    server_writer.write(head + body)
                    await server_writer.drain()
                    return
                server_writer.write(head + body)
                await server_writer.drain()

    async def _from_server(
        self, reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, cut: asyncio.Event
    ) -> None:
        """Server -> client: typed messages, passed on until the cut; then read to the COMMIT's answer."""
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readexactly(5)
                body = await reader.readexactly(int.from_bytes(head[1:], "big") - 4)
                if cut.is_set():
                    if head[:1] == _READY:  # the COMMIT is through, and its answer lost
                        self.dropped += 1
                        self._drop.set()
                        return
                    continue
                client_writer.write(head + body)
                await client_writer.drain()
