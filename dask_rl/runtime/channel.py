"""A direct channel to the parameter actor: combined trips over a socket of their own.

A combined trip through Dask (``actor.call_many``) passes the actor worker's event loop, a
hand-off to the actor's thread and Dask's framing on both sides: ~1.6 ms of the actor
worker's CPU per trip (``benchmarks/parameter_service.py``'s profile), several times the
update math of a small model. A channel carries the same trip as one framed message on a
plain TCP connection, served by a thread of the actor's worker that calls
:meth:`~dask_rl.runtime.parameter_actor.ParameterActor.call_many` under the actor's lock, as
Dask's thread would: the answers, the lock and exactly-once pushes are those of the Dask path.

Frames: a header (how many parts, each part's length), then the parts: a pickle (protocol 5)
and its numpy buffers out of band, so arrays are written from their own memory and read into
buffers of their own (no copy into one message). A connection carries one trip at a time; a
client keeps idle connections for the next trips. A connection starts with the channel's
token (random, handed out with the actor's handle): a connection without it is closed. A
trip that fails or times out closes its connection (its answer may still come), so a late
answer is never read as another trip's.

The actor's worker must be reachable on another port than Dask's (as on a LocalCluster, a
Kubernetes pod network or an HPC node); never with ``tls://``: the channel is not encrypted
(:func:`open_channel` refuses, and the callers use Dask).
"""

from __future__ import annotations

import hmac
import logging
import pickle
import secrets
import socket
import struct
import threading
import weakref
from typing import Any, Callable

logger = logging.getLogger(__name__)

_COUNT = struct.Struct("!I")
TOKEN_BYTES = 16
TOKEN_WAIT_S = 10.0


def _send(sock: socket.socket, obj: Any) -> None:
    buffers: list[pickle.PickleBuffer] = []
    main = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    parts = [memoryview(main), *(b.raw() for b in buffers)]
    header = _COUNT.pack(len(parts)) + struct.pack(f"!{len(parts)}Q", *(p.nbytes for p in parts))
    pending = [p for p in (memoryview(header), *parts) if p.nbytes]
    i = 0
    while i < len(pending):  # sendmsg may write part of what it is given
        sent = sock.sendmsg(pending[i:i + 512])
        while sent:
            if sent >= pending[i].nbytes:
                sent -= pending[i].nbytes
                i += 1
            else:
                pending[i], sent = pending[i][sent:], 0


def _recv_into(sock: socket.socket, buf: bytearray | memoryview) -> None:
    view, got = memoryview(buf), 0
    while got < view.nbytes:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the parameter actor's channel closed")
        got += n


def _recv(sock: socket.socket) -> Any:
    head = bytearray(_COUNT.size)
    _recv_into(sock, head)
    (count,) = _COUNT.unpack(head)
    lengths = bytearray(8 * count)
    _recv_into(sock, lengths)
    parts = [bytearray(n) for n in struct.unpack(f"!{count}Q", lengths)]
    for part in parts:
        _recv_into(sock, part)
    return pickle.loads(parts[0], buffers=parts[1:])


class ChannelServer:
    """Serves trips to ``serve`` (an actor's ``call_many``, held weakly: the channel closes
    when the actor is released) on a port of ``host``."""

    def __init__(self, serve: Callable[[list], Any], host: str):
        self._serve = weakref.WeakMethod(serve)
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self._listener = socket.create_server((host, 0))
        self.address = (host, self._listener.getsockname()[1])
        self.closed = False
        self.trips = 0  # trips served
        weakref.finalize(serve.__self__, self.close)
        threading.Thread(target=self._accept, name="parameter-channel", daemon=True).start()

    def close(self) -> None:
        self.closed = True
        try:
            self._listener.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True,
                             name="parameter-channel-trip").start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                token = bytearray(TOKEN_BYTES)
                conn.settimeout(TOKEN_WAIT_S)  # a silent connection holds no thread long
                _recv_into(conn, token)
                if not hmac.compare_digest(bytes(token), self.token):
                    logger.warning("a connection to the parameter channel without its token "
                                   "was closed")
                    return
                conn.settimeout(None)
                while not self.closed:
                    calls = _recv(conn)
                    serve = self._serve()
                    if serve is None:  # the actor is gone
                        return
                    try:
                        reply = (True, serve(calls))
                    except Exception as exc:  # noqa: BLE001 - the trip's callers raise it
                        reply = (False, exc)
                    del serve
                    self.trips += 1
                    try:
                        _send(conn, reply)
                    except (pickle.PicklingError, TypeError, AttributeError) as exc:
                        # pickled before anything is written: the trip fails, not the channel
                        _send(conn, (False, RuntimeError(f"the parameter actor's answer "
                                                         f"could not be pickled: {exc!r}")))
            except (OSError, EOFError, pickle.UnpicklingError):
                return  # the caller went (or gave up on its trip): its connection with it


class Unreachable(ConnectionError):
    """No connection to the channel could be made (its worker is gone, or a firewall lets
    Dask's port through and not the channel's): the caller may go through Dask instead."""


class ChannelClient:
    """Sends trips to a :class:`ChannelServer` at ``address``, one per connection at a time,
    idle connections kept for the next."""

    def __init__(self, address: tuple[str, int], token: bytes):
        self.address = tuple(address)
        self.token = token
        self.reachable = True  # set False by a caller that found it unreachable
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    def send(self, calls: list, timeout: float | None) -> Any:
        """The actor's answer to one trip (raises what the trip raised, ``TimeoutError`` past
        ``timeout`` seconds, :class:`Unreachable` if no connection can be made, another
        ``OSError`` if the connection fails during the trip)."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            try:
                conn = socket.create_connection(self.address, timeout=timeout)
            except OSError as exc:
                raise Unreachable(f"the parameter actor's channel at {self.address[0]}:"
                                  f"{self.address[1]}: {exc}") from exc
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(self.token)
        try:
            conn.settimeout(timeout)
            _send(conn, calls)
            ok, value = _recv(conn)
        except BaseException:
            conn.close()  # its answer may still come: never read it as another trip's
            raise
        with self._lock:
            self._idle.append(conn)
        if not ok:
            raise value
        return value

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def open_channel(serve: Callable[[list], Any]) -> ChannelServer | None:
    """A channel serving ``serve`` on the interface of this worker's Dask address, or None
    where there is no plain TCP address to share (``tls://``, ``inproc://``, not in a worker):
    the callers then use Dask."""
    from distributed import get_worker
    from distributed.comm import parse_address, parse_host_port

    try:
        scheme, location = parse_address(get_worker().address)
    except ValueError:  # not in a worker
        return None
    if scheme != "tcp":
        logger.info("no direct parameter channel on a %s:// worker: calls go through Dask",
                    scheme)
        return None
    return ChannelServer(serve, parse_host_port(location)[0])
