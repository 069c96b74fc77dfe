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
client keeps idle connections for the next trips. A connection starts with a handshake in
which each side proves it holds the channel's token (random, handed out with the actor's
handle) without sending it: a connection that cannot is closed. A trip's timeout bounds its
sending and its answer together; a trip that fails or times out closes its connection (its
answer may still come), so a late answer is never read as another trip's.

The actor's worker must be reachable on another port than Dask's: any free one (a
LocalCluster, an HPC node), or one of the range in ``DASK_RL_CHANNEL_PORTS``, which the
Kubernetes manifests set and their NetworkPolicy admits. Never with ``tls://``: the channel is
not encrypted (:func:`open_channel` refuses, and the callers use Dask).
"""

from __future__ import annotations

import hmac
import logging
import os
import pickle
import secrets
import socket
import struct
import threading
import time
import weakref
from typing import Any, Callable

logger = logging.getLogger(__name__)

_COUNT = struct.Struct("!I")
PORTS_ENV = "DASK_RL_CHANNEL_PORTS"
TOKEN_BYTES = 16
HANDSHAKE_S = 10.0  # a connection that does not prove the token by then is closed
CONNECT_S = 5.0     # a connection's own budget: never the little left of a caller's time
RETRY_S = 30.0      # after an unreachable channel, calls go through Dask this long, then retry
RETRY_MAX_S = 600.0  # ... doubling each time it is still unreachable, up to this


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("a trip over the parameter actor's channel ran out of time")
    return left


def _dumps(obj: Any) -> list[memoryview]:
    """The frame of ``obj``: header, pickle, out-of-band buffers (empty parts left out)."""
    buffers: list[pickle.PickleBuffer] = []
    main = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    parts = [memoryview(main), *(b.raw() for b in buffers)]
    header = _COUNT.pack(len(parts)) + struct.pack(f"!{len(parts)}Q", *(p.nbytes for p in parts))
    return [p for p in (memoryview(header), *parts) if p.nbytes]


def _send(sock: socket.socket, frame: list[memoryview], deadline: float | None = None) -> None:
    i = 0
    while i < len(frame):  # sendmsg may write part of what it is given
        sock.settimeout(_left(deadline))
        sent = sock.sendmsg(frame[i:i + 512])
        while sent:
            if sent >= frame[i].nbytes:
                sent -= frame[i].nbytes
                i += 1
            else:
                frame[i], sent = frame[i][sent:], 0


def _recv_into(sock: socket.socket, buf: bytearray, deadline: float | None = None) -> None:
    view, got = memoryview(buf), 0
    while got < view.nbytes:
        sock.settimeout(_left(deadline))
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the parameter actor's channel closed")
        got += n


def _recv_parts(sock: socket.socket, deadline: float | None = None) -> list[bytearray]:
    head = bytearray(_COUNT.size)
    _recv_into(sock, head, deadline)
    (count,) = _COUNT.unpack(head)
    lengths = bytearray(8 * count)
    _recv_into(sock, lengths, deadline)
    parts = [bytearray(n) for n in struct.unpack(f"!{count}Q", lengths)]
    for part in parts:
        _recv_into(sock, part, deadline)
    return parts


def _loads(parts: list[bytearray]) -> Any:
    return pickle.loads(parts[0], buffers=parts[1:])


def _proof(token: bytes, side: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, side + nonce, "sha256").digest()


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # a silently lost peer ends


def _listen(host: str) -> socket.socket:
    """A listening socket on ``host``: any free port, or the first free one of the range in
    ``DASK_RL_CHANNEL_PORTS`` (``8791-8798``: where a NetworkPolicy admits only named ports,
    as ``dask-rl k8s render`` writes them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    spec = os.environ.get(PORTS_ENV, "").strip()
    if not spec:
        return socket.create_server((host, 0), family=family)
    try:
        first, _, last = spec.partition("-")
        ports = range(int(first), int(last or first) + 1)
    except ValueError:
        raise OSError(f"{PORTS_ENV}={spec!r} is no port range (e.g. 8791-8798)") from None
    for port in ports:
        try:
            return socket.create_server((host, port), family=family)
        except OSError:  # taken (another actor of this worker, say): the next
            continue
    raise OSError(f"no free port in {PORTS_ENV}={spec}")


class ChannelServer:
    """Serves trips to ``serve`` (an actor's ``call_many``, held weakly: the channel closes
    when the actor is released) on a port of ``host``.

    Each side proves it holds the token without sending it: the client sends a nonce, the
    server answers its own nonce and an HMAC of the client's, the client answers an HMAC of
    the server's. So a process that took a dead worker's port learns nothing a client would
    act on, and a client unpickles only what a holder of the token sent."""

    def __init__(self, serve: Callable[[list], Any], host: str):
        self._serve = weakref.WeakMethod(serve)
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self._listener = _listen(host)
        self.address = (host, self._listener.getsockname()[1])
        self.closed = False
        self.trips = 0  # trips served
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        weakref.finalize(serve.__self__, self.close)
        threading.Thread(target=self._accept, name="parameter-channel", daemon=True).start()

    def close(self) -> None:
        """Stop listening and end every connection (a thread blocked in ``accept`` or a
        read is woken by the shutdown; a plain close would not wake it)."""
        with self._lock:
            self.closed = True
            socks, self._conns = [self._listener, *self._conns], set()
        for sock in socks:
            for end in (lambda: sock.shutdown(socket.SHUT_RDWR), sock.close):
                try:
                    end()
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            with self._lock:
                if self.closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._connection, args=(conn,), daemon=True,
                             name="parameter-channel-trip").start()

    def _handshake(self, conn: socket.socket) -> bool:
        deadline = time.monotonic() + HANDSHAKE_S  # a silent connection holds no thread long
        theirs = bytearray(TOKEN_BYTES)
        _recv_into(conn, theirs, deadline)
        mine = secrets.token_bytes(TOKEN_BYTES)
        _send(conn, [memoryview(mine + _proof(self.token, b"server", bytes(theirs)))], deadline)
        proof = bytearray(32)
        _recv_into(conn, proof, deadline)
        return hmac.compare_digest(bytes(proof), _proof(self.token, b"client", mine))

    def _connection(self, conn: socket.socket) -> None:
        try:
            _tune(conn)
            if not self._handshake(conn):
                logger.warning("a connection to the parameter channel without its token "
                               "was closed")
                return
            conn.settimeout(None)
            while not self.closed:
                parts = _recv_parts(conn)
                serve = self._serve()
                if serve is None:  # the actor is gone
                    return
                try:
                    reply = (True, serve(_loads(parts)))
                except Exception as exc:  # noqa: BLE001 - the trip's callers raise it
                    reply = (False, exc)
                del serve, parts
                with self._lock:
                    self.trips += 1
                try:
                    frame = _dumps(reply)
                except Exception as exc:  # noqa: BLE001 - pickled before anything is sent
                    frame = _dumps((False, RuntimeError(
                        f"the parameter actor's answer could not be pickled: {exc!r}")))
                del reply  # an exception's traceback would hold the actor between trips
                _send(conn, frame)
        except (OSError, EOFError, MemoryError, struct.error):
            return  # the caller went (or gave up on its trip): its connection with it
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()


class Unreachable(ConnectionError):
    """No connection to the channel could be made (its worker is gone, or a firewall lets
    Dask's port through and not the channel's): the caller may go through Dask instead."""


class ChannelClient:
    """Sends trips to a :class:`ChannelServer` at ``address``, one per connection at a time,
    idle connections kept for the next.

    After :class:`Unreachable` the client is not :attr:`reachable` for ``RETRY_S`` seconds
    (its caller goes through Dask meanwhile), then tries again; each further failure doubles
    the wait, up to ``RETRY_MAX_S``; a connection made resets it. A passing fault (a backlog
    full, a network blip) so costs the channel for a while, not for the actor's lifetime, and
    a firewall that never lets it through costs one connect attempt per ``RETRY_MAX_S``."""

    def __init__(self, address: tuple[str, int], token: bytes):
        self.address = tuple(address)
        self.token = token
        self._retry_at = 0.0  # monotonic time before which the channel is not tried
        self._backoff = RETRY_S
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def reachable(self) -> bool:
        """Whether to try the channel now (False for a while after :class:`Unreachable`)."""
        return time.monotonic() >= self._retry_at

    def _connect(self) -> socket.socket:
        """A connection whose server proved the token (within ``CONNECT_S``, whatever is
        left of the caller's time)."""
        deadline = time.monotonic() + CONNECT_S
        try:
            conn = socket.create_connection(self.address, timeout=CONNECT_S)
        except OSError as exc:
            with self._lock:
                wait, self._backoff = self._backoff, min(2 * self._backoff, RETRY_MAX_S)
                self._retry_at = time.monotonic() + wait
            raise Unreachable(f"the parameter actor's channel at {self.address[0]}:"
                              f"{self.address[1]}: {exc}; Dask carries the calls for the "
                              f"next {wait:.0f} s") from exc
        with self._lock:
            self._backoff = RETRY_S
        try:
            _tune(conn)
            mine = secrets.token_bytes(TOKEN_BYTES)
            _send(conn, [memoryview(mine)], deadline)
            answer = bytearray(TOKEN_BYTES + 32)
            _recv_into(conn, answer, deadline)
            theirs, proof = bytes(answer[:TOKEN_BYTES]), bytes(answer[TOKEN_BYTES:])
            if not hmac.compare_digest(proof, _proof(self.token, b"server", mine)):
                raise ConnectionError(f"{self.address[0]}:{self.address[1]} is not the "
                                      f"parameter actor's channel (it lacks the token)")
            _send(conn, [memoryview(_proof(self.token, b"client", theirs))], deadline)
        except BaseException:
            conn.close()
            raise
        return conn

    def send(self, calls: list, timeout: float | None) -> Any:
        """The actor's answer to one trip (raises what the trip raised, ``TimeoutError`` past
        ``timeout`` seconds for the trip's sending and answer, :class:`Unreachable` if no
        connection can be made, another ``OSError`` if the connection fails on the way)."""
        frame = _dumps(calls)  # a call that cannot be pickled fails before any connection
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            _send(conn, frame, deadline)
            ok, value = _loads(_recv_parts(conn, deadline))
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
    host = parse_host_port(location)[0]
    try:
        return ChannelServer(serve, host)
    except OSError as exc:  # e.g. an advertised address that is no interface here (NAT)
        logger.warning("no direct parameter channel on %s (%s): calls go through Dask",
                       host, exc)
        return None
