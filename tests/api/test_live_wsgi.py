"""api.live_wsgi, the in-process server of a waiting response: the end of a body whose coroutine has
just returned. Its thread closes the event loop while the WSGI iterator, done, tells the loop the client
left; CI once saw that telling raise `RuntimeError: Event loop is closed` into a test's GET
(tests/api/test_waiting.py, a reconnecting stream of a revoked key). The loop below makes that
interleaving happen every time instead of once in a few thousand requests."""

from __future__ import annotations

import asyncio
import threading

from api import live_wsgi

WAIT = 5.0  # seconds either side waits for the other before going on anyway


class _LoopThatClosesDuringTheTelling(asyncio.SelectorEventLoop):
    """`close()` (the body's thread, after the coroutine returned) waits until the iterator starts telling
    the loop that the client left; the telling goes on only once the loop has closed."""

    def __init__(self) -> None:
        super().__init__()
        self.iterating = threading.current_thread()  # serve_wsgi makes its loop in the server's thread
        self.telling = threading.Event()
        self.closed = threading.Event()

    def call_soon_threadsafe(self, *args, **kwargs):
        if threading.current_thread() is self.iterating:
            self.telling.set()
            self.closed.wait(WAIT)
        return super().call_soon_threadsafe(*args, **kwargs)

    def close(self) -> None:
        self.telling.wait(WAIT)
        super().close()
        self.closed.set()


class _AnsweredBody:
    """A LiveBody whose coroutine answers at once (a finished job, a revoked key's error event)."""

    job_id = "job-1"

    def __init__(self) -> None:
        self.started: list[str] = []

    def start_response(self, status, headers):
        self.started.append(status)

    async def serve(self, protocol, feed, offload):
        protocol.response_bytes(200, [("Content-Type", "text/plain")], b"answered")


class _Feed:
    async def close(self) -> None:
        pass


def test_a_body_whose_loop_closes_while_the_iterator_ends_answers_whole_without_an_error(monkeypatch):
    loops: list[_LoopThatClosesDuringTheTelling] = []

    def new_loop():
        loops.append(_LoopThatClosesDuringTheTelling())
        return loops[-1]

    monkeypatch.setattr(live_wsgi.asyncio, "new_event_loop", new_loop)
    body = _AnsweredBody()

    chunks = list(live_wsgi.serve_wsgi(body, _Feed()))  # type: ignore[arg-type]

    assert body.started == ["200 OK"] and chunks == [b"answered"]
    assert loops[0].telling.is_set() and loops[0].is_closed(), "the interleaving under test happened"
