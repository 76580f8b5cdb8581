"""A LiveBody under a plain WSGI server (Flask's test client, httpx's WSGITransport): in-process tests.

`stepwise api` runs a LiveBody's `serve` on granian's event loop (stepwise_cli.api_rsgi). A WSGI server
has no loop to lend, so here each waiting request runs that same coroutine on an event loop of its own,
on a thread, with a feed of its own, and this iterator hands its answer to the server chunk by chunk
(`QueueProtocol` stands in for granian's protocol object). A waiting request so costs a thread and a
Redis subscription: right for tests, not a way to serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Iterator
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from storage.job_event_feed import JobEventFeed

if TYPE_CHECKING:
    from api.live import Headers, LiveBody

JOIN_SECONDS = 10.0  # how long closing the body waits for its coroutine to see the client gone


class _Done:
    """The coroutine has returned (`error`: what it raised)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class QueueProtocol:
    """granian's protocol object, as far as a LiveBody uses it, over a queue the WSGI iterator reads."""

    def __init__(self, gone: asyncio.Event) -> None:
        self.items: queue.Queue[Any] = queue.Queue()  # (status, headers), then bytes chunks, then a _Done
        self.gone = gone

    def response_bytes(self, status: int, headers: Headers, body: bytes) -> None:
        self.items.put((status, headers))
        self.items.put(body)

    def response_stream(self, status: int, headers: Headers) -> QueueProtocol:
        self.items.put((status, headers))
        return self

    async def send_bytes(self, chunk: bytes) -> None:
        if self.gone.is_set():
            raise ConnectionResetError("the client is gone")
        self.items.put(chunk)

    async def client_disconnect(self) -> None:
        await self.gone.wait()


def serve_wsgi(body: LiveBody, feed: JobEventFeed) -> Iterator[bytes]:
    """Run `body.serve` on a loop of its own in a thread; yield what it answers, calling `start_response` first.
    Closing the iterator (the client left) tells the coroutine, as a disconnect would."""
    loop = asyncio.new_event_loop()
    gone = asyncio.Event()
    protocol = QueueProtocol(gone)

    async def run() -> None:
        async def offload(call: Any, *args: Any) -> Any:
            return await loop.run_in_executor(None, call, *args)

        try:
            await body.serve(protocol, feed, offload)
        finally:
            await feed.close()

    def thread_main() -> None:
        try:
            loop.run_until_complete(run())
            protocol.items.put(_Done())
        except BaseException as e:  # handed to the iterator, which raises it in the server's thread
            protocol.items.put(_Done(e))
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    thread = threading.Thread(target=thread_main, name=f"live-{body.job_id}", daemon=True)
    thread.start()
    try:
        started = False
        while True:
            item = protocol.items.get()
            if isinstance(item, _Done):
                if item.error is not None:
                    raise item.error
                return
            if isinstance(item, tuple):
                status, headers = item
                body.start_response(f"{status} {HTTPStatus(status).phrase}", headers)
                started = True
            elif started:
                yield item
    finally:
        if thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed in between: the coroutine has returned
                loop.call_soon_threadsafe(gone.set)
            thread.join(JOIN_SECONDS)
