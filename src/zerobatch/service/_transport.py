"""The request/reply layer both services share: sockets, security, messages.

A request is ``[header, *payload]`` sent by a DEALER; the server's ROUTER
sees ``[identity, header, *payload]``. A reply is ``[header, *payload]``.
Headers are single msgpack maps (no pickle, size-capped, checked field by
field); payloads are the F + 1 frames of :meth:`Batch.to_frames` or raw
arrays. Every header carries ``id`` (an int the client picks); a reply
header carries the request's ``id`` and ``ok``, plus ``error`` when not ok.

Sockets: ``LINGER`` 0 (closing never blocks), ``ROUTER_MANDATORY`` (a reply
to a vanished client raises instead of vanishing), replies sent with
``NOBLOCK`` (a slow client whose queue is full loses that reply and retries;
the server never waits for it), ``MAXMSGSIZE`` caps what a peer may send.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import zmq

from zerobatch.columnar.wire import pack, unpack
from zerobatch.errors import FormatError

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Channel",
    "CurveKeys",
    "Server",
    "ServiceError",
    "check_bind",
    "client_socket",
    "parse_header",
]

log = logging.getLogger("zerobatch.service")

DEFAULT_MAX_MESSAGE_BYTES = 4 << 30
"""Largest request a server accepts (bytes, all frames together): 4 GiB."""

PROTOCOL = 1
"""Version of the request/reply headers (independent of the package version)."""


class ServiceError(RuntimeError):
    """A server answered a request with an error (the message is the server's)."""

    def __init__(self, message: str, *, address: str) -> None:
        self.address = address
        super().__init__(f"{address}: {message}")


@dataclass(frozen=True)
class CurveKeys:
    """A CURVE key pair (Z85 bytes, 40 characters each), from :meth:`generate`
    or ``zmq.auth.load_certificate``."""

    public: bytes
    secret: bytes

    @classmethod
    def generate(cls) -> CurveKeys:
        """A fresh random key pair."""
        public, secret = zmq.curve_keypair()
        return cls(public, secret)


def _is_loopback(address: str) -> bool:
    """True for ``ipc://``/``inproc://`` and TCP on 127.0.0.0/8, ::1 or ``localhost``."""
    parts = urlsplit(address)
    if parts.scheme in ("ipc", "inproc"):
        return True
    host = (parts.hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(address: str, *, curve: CurveKeys | None, insecure: bool) -> None:
    """ValueError unless binding ``address`` is safe: loopback, or CURVE keys, or ``insecure``."""
    if urlsplit(address).scheme not in ("tcp", "ipc", "inproc"):
        raise ValueError(f"address {address!r}: expected tcp://HOST:PORT, ipc:// or inproc://")
    if _is_loopback(address) or curve is not None:
        return
    if not insecure:
        raise ValueError(
            f"address {address!r} is not loopback: pass curve=CurveKeys(...) so only clients "
            "with keys can connect, or insecure=True to serve anyone who can reach it"
        )
    log.warning("serving on %s without encryption or authentication (insecure=True)", address)


def _base_socket(context: zmq.Context, kind: int) -> zmq.Socket:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


class _AllowedKeys:
    """ZAP callback: a client may connect if its public key is in the set."""

    def __init__(self, keys: Collection[bytes]) -> None:
        self.keys = {bytes(k) for k in keys}

    def callback(self, domain: str, key: bytes) -> bool:
        return zmq.utils.z85.encode(key) in self.keys or key in self.keys


def server_socket(
    context: zmq.Context,
    address: str,
    *,
    curve: CurveKeys | None,
    allowed_clients: Collection[bytes] | None,
    max_message_bytes: int,
) -> tuple[zmq.Socket, Any]:
    """A bound ROUTER socket and its authenticator (None without an allow list)."""
    sock = _base_socket(context, zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    authenticator = None
    if curve is not None:
        if allowed_clients is not None:
            from zmq.auth.thread import ThreadAuthenticator

            authenticator = ThreadAuthenticator(context)
            authenticator.start()
            authenticator.configure_curve_callback("*", _AllowedKeys(allowed_clients))
        sock.curve_server = True
        sock.curve_publickey = curve.public
        sock.curve_secretkey = curve.secret
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        sock.close()
        if authenticator is not None:
            authenticator.stop()
        raise OSError(f"cannot bind {address}: {exc}") from exc
    return sock, authenticator


def client_socket(
    context: zmq.Context,
    address: str,
    *,
    curve: CurveKeys | None,
    server_key: bytes | None,
) -> zmq.Socket:
    """A DEALER connected to ``address`` (CURVE when ``server_key`` is given)."""
    sock = _base_socket(context, zmq.DEALER)
    if server_key is not None:
        keys = curve or CurveKeys.generate()
        sock.curve_serverkey = server_key
        sock.curve_publickey = keys.public
        sock.curve_secretkey = keys.secret
    sock.connect(address)
    return sock


def parse_header(buffer: Any) -> dict[str, Any]:
    """The request or reply header map, or FormatError (``path='header'``)."""
    header = unpack(buffer, where="header", field="header")
    if not isinstance(header, dict):
        raise FormatError(
            f"expected a map, found {type(header).__name__}", path="header", field="header"
        )
    if header.get("v") != PROTOCOL:
        raise FormatError(
            f"protocol version {header.get('v')!r}, expected {PROTOCOL}", path="header", field="v"
        )
    return header


def no_payload(op: str, payload: Sequence[Any]) -> None:
    """FormatError if a request that takes no payload came with frames after its header."""
    if payload:
        raise FormatError(
            f"{op} takes no payload, found {len(payload)} frames", path="frame 1", field="payload"
        )


def encode_header(header: dict[str, Any]) -> bytes:
    """msgpack bytes of ``header`` with the protocol version added."""
    return pack({"v": PROTOCOL, **header})


Handler = Callable[[dict[str, Any], list[memoryview]], tuple[dict[str, Any], Sequence[Any]]]


class Server:
    """A ROUTER loop that answers each request with ``handler(header, payload)``.

    Single-threaded: requests are handled one at a time, in arrival order. A
    handler raising ``FormatError``, ``ValueError``, ``KeyError``, ``TypeError``,
    ``IndexError`` or ``OverflowError`` makes an error reply carrying its message; the loop goes on.
    Thread safety: :meth:`serve` runs in one thread; :meth:`stop` may be called
    from any thread.
    """

    def __init__(
        self,
        address: str,
        handler: Handler,
        *,
        curve: CurveKeys | None = None,
        allowed_clients: Collection[bytes] | None = None,
        insecure: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        check_bind(address, curve=curve, insecure=insecure)
        if allowed_clients is not None and curve is None:
            raise ValueError("allowed_clients needs curve=CurveKeys(...) for the server")
        self._handler = handler
        self._context = zmq.Context()
        self._socket, self._authenticator = server_socket(
            self._context,
            address,
            curve=curve,
            allowed_clients=allowed_clients,
            max_message_bytes=max_message_bytes,
        )
        self.address: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stopping = threading.Event()
        self._closed = False

    def serve(self, *, poll_ms: int = 100) -> None:
        """Answer requests until :meth:`stop`; then close the socket."""
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                if poller.poll(poll_ms):
                    self._answer(self._socket.recv_multipart(copy=False))
        finally:
            self.close()

    def stop(self) -> None:
        """Make :meth:`serve` return within ``poll_ms``."""
        self._stopping.set()

    def close(self) -> None:
        """Close the socket and context (idempotent); call only when not serving."""
        if self._closed:
            return
        self._closed = True
        self._socket.close(linger=0)
        if self._authenticator is not None:
            self._authenticator.stop()
        self._context.term()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _answer(self, frames: list[zmq.Frame]) -> None:
        identity, *message = frames
        request_id: Any = None
        payload: Sequence[Any] = ()
        try:
            if not message:
                raise FormatError("empty message: expected a header frame", path="header")
            header = parse_header(message[0].buffer)
            request_id = header.get("id")
            if type(request_id) is not int:
                raise FormatError("expected an int", path="header", field="id")
            reply, payload = self._handler(header, [f.buffer for f in message[1:]])
            reply = {"id": request_id, "ok": True, **reply}
        except (FormatError, ValueError, KeyError, TypeError, IndexError, OverflowError) as exc:
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            reply, payload = {"id": request_id, "ok": False, "error": str(text)}, ()
        try:
            self._socket.send_multipart(
                [identity.bytes, encode_header(reply), *payload], copy=False, flags=zmq.NOBLOCK
            )
        except zmq.Again:
            log.warning("client queue full: reply to request %r dropped", request_id)
        except zmq.ZMQError as exc:
            log.warning("client gone: reply to request %r not sent (%s)", request_id, exc)


class Channel:
    """One DEALER to one server, for blocking request/reply with a timeout.

    Replies to earlier requests that timed out are recognized by ``id`` and
    dropped. Not thread safe: use one Channel per thread.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float,
        curve: CurveKeys | None = None,
        server_key: bytes | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.address = address
        self.timeout = timeout
        self._context = zmq.Context()
        self._socket = client_socket(self._context, address, curve=curve, server_key=server_key)
        self._next_id = 0
        self._closed = False

    def request(
        self, header: dict[str, Any], payload: Sequence[Any] = ()
    ) -> tuple[dict[str, Any], list[memoryview]]:
        """Send one request and wait for its reply: (header, payload buffers).

        Raises ServiceError for an error reply, TimeoutError naming the address
        when no reply comes within ``timeout`` seconds.
        """
        if self._closed:
            raise ValueError(f"channel to {self.address} is closed")
        self._next_id += 1
        request_id = self._next_id
        message = [encode_header({**header, "id": request_id}), *payload]
        deadline = _now() + self.timeout
        while True:  # never a blocking send: the peer may vanish between poll and send
            try:
                self._socket.send_multipart(message, copy=False, flags=zmq.NOBLOCK)
                break
            except zmq.Again:
                left = deadline - _now()
                if left <= 0 or not self._socket.poll(int(left * 1000) + 1, zmq.POLLOUT):
                    raise self._no_reply() from None
        deadline = _now() + self.timeout
        while True:
            left = deadline - _now()
            if left <= 0 or not self._socket.poll(int(left * 1000) + 1, zmq.POLLIN):
                raise self._no_reply()
            frames = self._socket.recv_multipart(copy=False)
            reply = parse_header(frames[0].buffer)
            if reply.get("id") != request_id:
                continue  # the late reply of a request that timed out
            if not reply.get("ok"):
                raise ServiceError(str(reply.get("error")), address=self.address)
            return reply, [f.buffer for f in frames[1:]]

    def _no_reply(self) -> TimeoutError:
        return TimeoutError(
            f"{self.address}: no reply within {self.timeout} s (server down or unreachable, "
            "or its CURVE key refused ours)"
        )

    def close(self) -> None:
        """Close the socket (never blocks; idempotent)."""
        if not self._closed:
            self._closed = True
            self._socket.close(linger=0)
            self._context.term()


def _now() -> float:
    return time.monotonic()
