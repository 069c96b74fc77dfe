"""The parameter actor's direct channel (dask_rl.runtime.channel) on real sockets: a trip
over it is answered exactly as the actor answers the same calls itself, and a wrong token, a
failing trip, a timeout and a released actor each end as stated."""

import gc
import pickle
import socket
import threading
import time

import numpy as np
import pytest

from dask_rl.data import PolicySnapshot
from dask_rl.runtime import channel as channel_module
from dask_rl.runtime.channel import ChannelClient, ChannelServer, _dumps, _loads, _recv_parts, _send
from dask_rl.runtime.parameter_actor import ParameterActor
from dask_rl.staleness import AsyncConfig


def _actor(seed=0, size=20_000):
    return ParameterActor(np.random.default_rng(seed).standard_normal(size).astype(np.float32),
                          AsyncConfig())


def _trip(n, size=20_000):
    """Trip ``n`` (from 0): three pushes (fresh sequence numbers) among three pulls."""
    rng = np.random.default_rng(n)
    deltas = [rng.standard_normal(size).astype(np.float32) * 1e-3 for _ in range(3)]
    v, s = 3 * n, 3 * n + 1
    return [("pull", (), {"newer_than": -1}), ("push", (deltas[0], v, "A"), {"seq": s}),
            ("pull_learner", ("B",), {}), ("push", (deltas[1], v, "C"), {"seq": s + 1}),
            ("pull", (), {"newer_than": v + 5}), ("push", (deltas[2], v, "D"), {"seq": s + 2})]


def _same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and _same(vars(a), vars(b))
    return a == b


def test_a_trip_over_the_channel_is_answered_as_the_actor_answers_it_in_process():
    here, there = _actor(), _actor()
    server = ChannelServer(there.call_many, "127.0.0.1")
    client = ChannelClient(server.address, server.token)
    for n in range(3):  # the same connection carries one trip after another
        want = here.call_many(_trip(n)).items
        got = client.send(_trip(n), timeout=10).items
        assert [ok for ok, _ in got] == [ok for ok, _ in want]
        assert _same([v for _, v in got], [v for _, v in want])
    assert here.current.version == there.current.version == 9
    assert np.array_equal(here.current.params, there.current.params)
    assert len(client._idle) == 1  # one connection, kept for the next trip
    client.close()
    server.close()


@pytest.mark.parametrize("obj", [
    {"big": np.arange(3_000_000, dtype=np.float32)},  # 12 MB: written in pieces
    {"empty": np.zeros(0, np.float32), "scalar": np.float32(2.5), "none": None},
    {"strided": np.arange(100, dtype=np.float64)[::3], "text": "x" * 100_000,
     "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4))},
    {"many": [np.full(3, i, np.int64) for i in range(1500)]},  # more parts than one sendmsg
], ids=["large", "empty", "strided", "many"])
def test_frames_carry_any_arrays_exactly(obj):
    a, b = socket.socketpair()
    a.settimeout(10)  # non-blocking underneath: a full buffer makes sendmsg write in part
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    got = {}

    def read():
        time.sleep(0.2)  # let the sender fill the buffer first
        got.update(_loads(_recv_parts(b)))

    reader = threading.Thread(target=read)
    reader.start()
    _send(a, _dumps(obj))
    reader.join(10)
    assert _same(got, obj)
    a.close()
    b.close()


def test_a_client_without_the_token_is_refused_unserved():
    actor = _actor()
    server = ChannelServer(actor.call_many, "127.0.0.1")
    wrong = ChannelClient(server.address, bytes(16))
    with pytest.raises(ConnectionError, match="lacks the token"):
        wrong.send([("push", (np.ones(20_000, np.float32), 0, "A"), {"seq": 1})], timeout=10)
    # a raw client that answers the server's challenge wrongly is closed before any trip
    with socket.create_connection(server.address, timeout=10) as raw:
        raw.sendall(bytes(16))
        raw.recv(48)
        raw.sendall(bytes(32))
        raw.sendall(b"anything")
        assert raw.recv(10) == b""  # closed
    assert actor.current.version == 0  # nothing was served
    assert server.trips == 0
    server.close()


def test_a_server_without_the_token_is_never_sent_a_trip_nor_believed():
    listener = socket.create_server(("127.0.0.1", 0))
    seen = bytearray()

    def impostor():  # took the port: answers the handshake with what it can
        conn, _ = listener.accept()
        with conn:
            seen.extend(conn.recv(16))
            conn.sendall(bytes(48))
            conn.settimeout(2)
            try:
                while chunk := conn.recv(65536):
                    seen.extend(chunk)
            except OSError:
                pass

    thread = threading.Thread(target=impostor)
    thread.start()
    client = ChannelClient(listener.getsockname(), b"t" * 16)
    with pytest.raises(ConnectionError, match="lacks the token"):
        client.send([("pull", (), {})], timeout=10)
    thread.join(10)
    assert len(seen) == 16 and b"t" * 16 not in seen  # a nonce only: no token, no trip
    listener.close()


def test_a_silent_connection_is_closed_after_the_handshake_time(monkeypatch):
    monkeypatch.setattr(channel_module, "HANDSHAKE_S", 0.3)
    actor = _actor()
    server = ChannelServer(actor.call_many, "127.0.0.1")
    with socket.create_connection(server.address, timeout=10) as raw:
        t0 = time.monotonic()
        assert raw.recv(10) == b""  # the server ended it
        assert time.monotonic() - t0 < 5
    deadline = time.monotonic() + 5
    while server._conns and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server._conns
    server.close()


def test_a_failing_trip_raises_its_error_and_the_connection_goes_on():
    actor = _actor()  # the channel holds it weakly
    server = ChannelServer(actor.call_many, "127.0.0.1")
    client = ChannelClient(server.address, server.token)
    with pytest.raises(ValueError, match="not combined"):
        client.send([("state_dict", (), {})], timeout=10)
    ok, snap = client.send([("pull", (), {})], timeout=10).items[0]
    assert ok and snap.version == 0
    server.close()


def test_an_answer_that_cannot_be_pickled_fails_its_trip_not_the_channel():
    class Serve:
        def call_many(self, calls):
            return calls[0] if calls else (lambda: None)

    serve = Serve()
    server = ChannelServer(serve.call_many, "127.0.0.1")
    client = ChannelClient(server.address, server.token)
    with pytest.raises(RuntimeError, match="could not be pickled"):
        client.send([], timeout=10)
    assert client.send(["next"], timeout=10) == "next"  # the same connection goes on
    assert len(client._idle) == 1
    server.close()


def test_a_trip_past_its_timeout_raises_and_its_late_answer_is_never_read():
    actor = _actor()
    server = ChannelServer(actor.call_many, "127.0.0.1")
    client = ChannelClient(server.address, server.token)
    client.send([("pull", (), {})], timeout=10)  # a connection to reuse
    actor.lock.acquire()  # the actor hangs
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        client.send([("push", (np.ones(20_000, np.float32), 0, "A"), {"seq": 1})], timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert client._idle == []  # the timed-out trip's connection is closed, not kept
    actor.lock.release()  # the late push is served; its answer goes nowhere
    ok, snap = client.send([("pull", (), {})], timeout=10).items[0]
    # this trip's own answer (the pull, after the late push), not the push's acknowledgement
    assert ok and isinstance(snap, PolicySnapshot) and snap.version == 1
    server.close()


def test_a_released_actor_closes_its_channel():
    actor = _actor()
    server = ChannelServer(actor.call_many, "127.0.0.1")
    client = ChannelClient(server.address, server.token)
    client.send([("pull", (), {})], timeout=10)
    del actor
    gc.collect()
    assert server.closed
    with pytest.raises(OSError):  # the idle connection was ended with the channel
        client.send([("pull", (), {})], timeout=10)
    with pytest.raises(ConnectionRefusedError):  # and nothing listens on its port any more
        socket.create_connection(server.address, timeout=10)


def test_the_token_and_channel_address_survive_pickling_with_the_handle():
    from dask_rl.runtime.handle import ActorHandle

    handle = ActorHandle(actor=None, timeout=3.0, epoch="0-x",
                         channel=(("127.0.0.1", 1234), b"t" * 16))
    again = pickle.loads(pickle.dumps(handle))
    assert again.channel == (("127.0.0.1", 1234), b"t" * 16)


def test_an_actor_opens_a_channel_on_a_tcp_worker_and_none_on_an_inproc_one():
    from distributed import Client, LocalCluster

    from dask_rl.runtime.handle import ActorHandle

    params = np.zeros(10, np.float32)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        assert cluster.scheduler_address.startswith("inproc://")
        actor = client.submit(ParameterActor, params, AsyncConfig(), actor=True).result()
        assert actor.open_channel().result() is None  # its callers use Dask
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        future = client.submit(ParameterActor, params, AsyncConfig(), actor=True, workers=[a])
        actor = future.result()
        channel = actor.open_channel().result()
        assert channel[0][0] == a.split("://")[1].rsplit(":", 1)[0] and len(channel[1]) == 16
        assert actor.open_channel().result() == channel  # opened once
        handle = ActorHandle(actor, timeout=30.0, channel=channel)
        # a task on the other worker pulls through the channel
        version = client.submit(lambda h: h.call("pull").version, handle, workers=[b]).result()
        assert version == 0
        assert actor.metrics().result()["actor/channel_trips"] == 1
        # a channel no connection reaches (a firewall, say): the calls go through Dask
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()
        blocked = ActorHandle(actor, timeout=30.0, epoch="blocked", channel=(closed, channel[1]))
        versions = client.submit(lambda h: [h.call("pull").version for _ in range(3)], blocked,
                                 workers=[b]).result()
        assert versions == [0, 0, 0]
        assert actor.metrics().result()["actor/channel_trips"] == 1
        # released by Dask (the run's end, or a re-created actor): its channel closes
        del actor, handle, blocked
        client.cancel(future)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(channel[0], timeout=5).close()
            except ConnectionRefusedError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the released actor's channel still listens")


def test_the_channel_takes_the_first_free_port_of_its_range(monkeypatch):
    with socket.socket() as probe:  # a free range of three, very likely
        probe.bind(("127.0.0.1", 0))
        first = probe.getsockname()[1]
    monkeypatch.setenv(channel_module.PORTS_ENV, f"{first}-{first + 2}")
    actors = [_actor(i, 10) for i in range(4)]
    servers = [ChannelServer(a.call_many, "127.0.0.1") for a in actors[:3]]
    assert [srv.address[1] for srv in servers] == [first, first + 1, first + 2]
    with pytest.raises(OSError, match="no free port"):  # open_channel then falls back to Dask
        ChannelServer(actors[3].call_many, "127.0.0.1")
    monkeypatch.setenv(channel_module.PORTS_ENV, "eighty")
    with pytest.raises(OSError, match="no port range"):
        ChannelServer(actors[3].call_many, "127.0.0.1")
    for srv in servers:
        srv.close()


def test_an_unreachable_channel_is_retried_after_a_growing_wait(monkeypatch):
    """After Unreachable the channel rests RETRY_S (the caller uses Dask), then is tried again;
    each further failure doubles the rest (up to RETRY_MAX_S); a connection resets it."""
    monkeypatch.setattr(channel_module, "RETRY_S", 0.3)
    monkeypatch.setattr(channel_module, "RETRY_MAX_S", 0.6)
    with socket.socket() as probe:  # a port nothing listens on yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    actor = _actor(size=10)
    client = ChannelClient(("127.0.0.1", port), b"t" * 16)
    for rest in (0.3, 0.6, 0.6):  # doubled, then held at the cap
        assert client.reachable
        t0 = time.monotonic()
        with pytest.raises(channel_module.Unreachable, match="Dask carries the calls"):
            client.send([("pull", (), {})], timeout=10)
        assert not client.reachable and client._retry_at - time.monotonic() <= rest
        while not client.reachable:
            time.sleep(0.02)
        assert time.monotonic() - t0 >= rest
    monkeypatch.setenv(channel_module.PORTS_ENV, f"{port}-{port}")  # the channel comes up
    server = ChannelServer(actor.call_many, "127.0.0.1")
    client.token = server.token
    ok, snap = client.send([("pull", (), {})], timeout=10).items[0]
    assert ok and snap.version == 0 and client.reachable
    assert client._backoff == 0.3  # the next failure rests RETRY_S again
    server.close()
