"""Keep a window of requests in flight over several servers, survive their deaths.

Each server gets one DEALER socket and a monitor. A request goes to the live
server with the fewest outstanding requests. When a server disconnects (its
process died) or leaves a request unanswered for ``timeout`` seconds, its
outstanding requests go to the other servers (or wait for one to come back);
replies are matched by request id and kept by request key, so a late reply of a
reassigned request is dropped: nothing is lost or delivered twice. A server
that reconnects is used again. If no reply at all arrives for ``timeout``
seconds while requests wait, TimeoutError names every address.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from zerobatch.service._transport import (
    CurveKeys,
    ServiceError,
    client_socket,
    encode_header,
    parse_header,
)

__all__ = ["Fetcher"]

_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


@dataclass
class _Peer:
    address: str
    socket: zmq.Socket
    monitor: zmq.Socket
    live: bool = True
    retry_at: float = 0.0
    outstanding: dict[int, tuple[Any, float]] = field(default_factory=dict)  # id -> key, deadline


class Fetcher:
    """Requests to ``addresses``, answered in the order they were asked.

    Not thread safe: one thread drives it. :meth:`close` never blocks.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        timeout: float,
        window: int,
        curve: CurveKeys | None = None,
        server_key: bytes | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("addresses: give at least one server address")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if window < 1:
            raise ValueError(f"window must be >= 1 request, got {window}")
        self.timeout = timeout
        self.window = window
        self._context = zmq.Context()
        self._peers: list[_Peer] = []
        for address in addresses:
            sock = client_socket(self._context, address, curve=curve, server_key=server_key)
            self._peers.append(_Peer(address, sock, sock.get_monitor_socket(_EVENTS)))
        self._next_id = 0
        self._closed = False

    @property
    def addresses(self) -> list[str]:
        """The server addresses, in the order given."""
        return [peer.address for peer in self._peers]

    def request(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[memoryview]]:
        """One request answered by any server (the same failover as :meth:`run`)."""
        for _, reply, frames in self.run([(None, header)]):
            return reply, frames
        raise AssertionError("unreachable: run yields once per request")

    def run(
        self, requests: Iterable[tuple[Any, dict[str, Any]]]
    ) -> Iterator[tuple[Any, dict[str, Any], list[memoryview]]]:
        """``(key, reply header, payload)`` for each ``(key, header)``, in order.

        At most ``window`` requests are in flight; the next ones are sent as
        replies are consumed. Error replies raise :class:`ServiceError`.
        """
        try:
            yield from self._drive(iter(requests))
        finally:
            for peer in self._peers:
                peer.outstanding.clear()  # their late replies are dropped by id

    def _drive(
        self, source: Iterator[tuple[Any, dict[str, Any]]]
    ) -> Iterator[tuple[Any, dict[str, Any], list[memoryview]]]:
        order: deque[Any] = deque()  # keys asked, in order, not yet yielded
        headers: dict[Any, dict[str, Any]] = {}
        waiting: deque[Any] = deque()  # keys to (re)send
        done: dict[Any, tuple[dict[str, Any], list[memoryview]]] = {}
        exhausted = False
        last_progress = time.monotonic()
        while True:
            while not exhausted and len(order) < self.window:
                item = next(source, None)
                if item is None:
                    exhausted = True
                    break
                key, header = item
                order.append(key)
                headers[key] = header
                waiting.append(key)
            if not order:
                return
            self._send_waiting(waiting, headers)  # keep the window full before yielding
            if order[0] in done:
                key = order.popleft()
                reply, frames = done.pop(key)
                del headers[key]
                yield key, reply, frames
                last_progress = time.monotonic()
                continue
            if self._wait(waiting, done, order):
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self.timeout:
                raise TimeoutError(
                    f"no reply from any of {self.addresses} within {self.timeout} s "
                    "(servers down or unreachable, or their CURVE keys refused ours)"
                )

    def _send_waiting(self, waiting: deque[Any], headers: dict[Any, dict[str, Any]]) -> None:
        now = time.monotonic()
        for peer in self._peers:
            if not peer.live and peer.retry_at and now >= peer.retry_at:
                peer.live, peer.retry_at = True, 0.0  # silent for a while: try it again
        while waiting:
            live = [p for p in self._peers if p.live]
            if not live:
                return
            peer = min(live, key=lambda p: len(p.outstanding))
            key = waiting[0]
            self._next_id += 1
            message = [encode_header({**headers[key], "id": self._next_id})]
            try:
                peer.socket.send_multipart(message, flags=zmq.NOBLOCK)
            except zmq.Again:
                self._down(peer, waiting, retry=True)
                continue
            waiting.popleft()
            peer.outstanding[self._next_id] = (key, now + self.timeout)

    def _down(self, peer: _Peer, waiting: deque[Any], *, retry: bool) -> None:
        """Mark ``peer`` down and queue its outstanding requests again, oldest first."""
        peer.live = False
        peer.retry_at = time.monotonic() + self.timeout if retry else 0.0
        lost = [key for key, _ in peer.outstanding.values()]
        peer.outstanding.clear()
        waiting.extendleft(reversed(lost))

    def _wait(self, waiting: deque[Any], done: dict, order: deque[Any]) -> bool:
        """Poll once; True if a reply for a wanted key arrived."""
        now = time.monotonic()
        deadlines = [d for p in self._peers for _, d in p.outstanding.values()]
        retries = [p.retry_at for p in self._peers if not p.live and p.retry_at]
        until = min([*deadlines, *retries, now + self.timeout])
        poller = zmq.Poller()
        for peer in self._peers:
            poller.register(peer.socket, zmq.POLLIN)
            poller.register(peer.monitor, zmq.POLLIN)
        events = dict(poller.poll(max(0, int((until - now) * 1000)) + 1))
        progress = False
        wanted = set(order)
        for peer in self._peers:
            while peer.socket in events and peer.socket.poll(0):
                frames = peer.socket.recv_multipart(copy=False)
                reply = parse_header(frames[0].buffer)
                entry = peer.outstanding.pop(reply.get("id"), None)  # type: ignore[arg-type]
                if entry is None:
                    continue  # a late reply to a request given to another server
                if not reply.get("ok"):
                    raise ServiceError(str(reply.get("error")), address=peer.address)
                key = entry[0]
                if key in wanted and key not in done:
                    done[key] = (reply, [f.buffer for f in frames[1:]])
                    progress = True
            if peer.monitor in events:
                while peer.monitor.poll(0):
                    event = recv_monitor_message(peer.monitor)["event"]
                    if event == zmq.EVENT_DISCONNECTED:
                        self._down(peer, waiting, retry=False)
                    elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                        peer.live, peer.retry_at = True, 0.0
        now = time.monotonic()
        for peer in self._peers:
            if any(deadline <= now for _, deadline in peer.outstanding.values()):
                self._down(peer, waiting, retry=True)  # silent: alive but not answering
        return progress

    def close(self) -> None:
        """Close every socket (never blocks; idempotent)."""
        if self._closed:
            return
        self._closed = True
        for peer in self._peers:
            peer.socket.disable_monitor()
            peer.monitor.close(linger=0)
            peer.socket.close(linger=0)
        self._context.term()
