"""Promise: `store.errors.is_timeout` tells a store wait that reached its deadline from a store that failed,
on torch's real stores (a `TCPStore` and a `HashStore`, bare and behind a `PrefixStore`, as the package
uses them), and on `testing.InMemoryStore`; and the two waits that read a timeout as "not yet" read only
that so: a store that is gone raises, for their callers to say."""

import datetime
import time

import pytest

from accelerate_inorder_fix import testing
from accelerate_inorder_fix.store.connection import Connection, read_until, wait_until
from accelerate_inorder_fix.store.errors import is_timeout


dist = pytest.importorskip("torch.distributed")
SHORT = datetime.timedelta(seconds=0.05)


def _raised(call):
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


def _tcp_store():
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=SHORT)
    return server, dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=SHORT)


@pytest.fixture
def tcp_store():
    return _tcp_store()


def _stores(tcp_store):
    hash_store = dist.HashStore()
    hash_store.set_timeout(SHORT)
    server, client = tcp_store
    return [server, client, dist.PrefixStore("aif/", client), hash_store, dist.PrefixStore("aif/", hash_store)]


def test_a_get_or_wait_past_its_deadline_is_a_timeout_on_every_real_store(tcp_store):
    for store in _stores(tcp_store):
        assert is_timeout(_raised(lambda: store.get("missing"))), store
        assert is_timeout(_raised(lambda: store.wait(["missing"], SHORT))), store


def test_a_store_whose_server_is_gone_is_no_timeout():
    server, client = _tcp_store()
    client.set("a", "b")
    del server  # the server's thread stops with it
    error = _raised(lambda: client.get("a"))
    assert isinstance(error, dist.DistNetworkError) and not is_timeout(error)
    connection = Connection(client, "", 0.05)
    assert not is_timeout(_raised(lambda: read_until(connection, "a", time.monotonic() + 0.05, 0.05)))  # not None


def test_the_in_memory_stores_timeout_is_one_and_other_errors_are_not():
    store = testing.InMemoryStore(timeout=0.01)
    assert is_timeout(_raised(lambda: store.get("missing")))
    assert is_timeout(_raised(lambda: store.wait(["missing"], 0.01)))
    assert not is_timeout(RuntimeError("key holds another record")) and not is_timeout(OSError("timeout"))


def test_the_waits_read_a_timeout_as_not_yet_and_raise_a_failure():
    assert wait_until(testing.InMemoryStore(), ["q/1/0"], time.monotonic() + 0.01, 0.01) is False
    assert read_until(Connection(testing.InMemoryStore(), "", 0.01), "mode", time.monotonic() + 0.01, 0.01) is None

    class Gone(testing.InMemoryStore):
        def wait(self, keys, timeout=None):
            raise dist.DistNetworkError("Connection was likely closed")

    with pytest.raises(dist.DistNetworkError):
        wait_until(Gone(), ["q/1/0"], time.monotonic() + 0.01, 0.01)
    with pytest.raises(dist.DistNetworkError):
        read_until(Connection(Gone(), "", 0.01), "mode", time.monotonic() + 0.01, 0.01)


def test_the_verdicts_read_is_one_get_whose_timeout_is_the_slice_and_the_clients_own_comes_back(tcp_store):
    """`Connection.get_within` arms this thread's cloned client with the slice for one `get`, then gives it back
    its own timeout (T + `CLIENT_SLACK`); `read_until` reads a key that is there, and None for one that never comes."""
    server, _ = tcp_store
    connection = Connection(server, "aif/", 0.2)
    assert is_timeout(_raised(lambda: connection.get_within("missing", 0.02)))
    assert connection._local.client.timeout == datetime.timedelta(seconds=5.2)
    connection.set("here", "v")
    assert read_until(connection, "here", time.monotonic() + 0.2, 0.2) == b"v"
    assert read_until(connection, "missing", time.monotonic() + 0.05, 0.2) is None
    assert connection._local.client.timeout == datetime.timedelta(seconds=5.2)
