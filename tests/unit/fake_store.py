"""An in-memory stand-in for the part of torch's c10d `Store` API that gather mode uses.

For unit tests of pure logic only (the collector's routing, deadlines and batching); the protocol
itself is proven on a real `TCPStore` by the job tests and the scale benchmark. Thread-safe: one
lock, one condition; a blocking call waits on the condition with its timeout, never sleeps.

`FakeStore` has the batched calls of torch 2.x (`multi_get`, `multi_set`, `append`); `UnbatchedFakeStore`
lacks them, as the older releases accelerate supports do, so the fallback path runs too.
"""

import datetime
import threading
import time


class StoreTimeout(RuntimeError):
    """What `wait`/`get` raise at their deadline (torch's `DistStoreError` is a RuntimeError too)."""


def _seconds(timeout):
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)


class UnbatchedFakeStore:
    def __init__(self, timeout=5.0):
        self.timeout = timeout
        self.data = {}
        self.calls = []  # (method, number of keys): what the code under test asked for
        self._changed = threading.Condition()

    def _log(self, method, keys=1):
        self.calls.append((method, keys))

    def set(self, key, value):
        with self._changed:
            self._log("set")
            self.data[key] = value if isinstance(value, bytes) else str(value).encode()
            self._changed.notify_all()

    def compare_set(self, key, expected, desired):
        """torch's semantics: set `desired` when the value is `expected` (absent counts as b""); return the value now."""
        expected = expected if isinstance(expected, bytes) else str(expected).encode()
        desired = desired if isinstance(desired, bytes) else str(desired).encode()
        with self._changed:
            self._log("compare_set")
            current = self.data.get(key)
            if current == expected or (current is None and expected == b""):
                self.data[key] = desired
                self._changed.notify_all()
                return desired
            return expected if current is None else current

    def _wait_for(self, keys, timeout):
        deadline = time.monotonic() + timeout
        if not self._changed.wait_for(
            lambda: all(k in self.data for k in keys), max(0.0, deadline - time.monotonic())
        ):
            raise StoreTimeout(f"timed out after {timeout:g} s waiting for {sorted(set(keys) - set(self.data))}")

    def get(self, key):
        with self._changed:
            self._log("get")
            self._wait_for([key], self.timeout)
            return self.data[key]

    def wait(self, keys, timeout=None):
        with self._changed:
            self._log("wait", len(keys))
            self._wait_for(list(keys), self.timeout if timeout is None else _seconds(timeout))

    def check(self, keys):
        with self._changed:
            self._log("check", len(keys))
            return all(k in self.data for k in keys)

    def delete_key(self, key):
        with self._changed:
            self._log("delete_key")
            return self.data.pop(key, None) is not None

    def add(self, key, amount):
        with self._changed:
            self._log("add")
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self._changed.notify_all()
            return value

    def num_keys(self):
        with self._changed:
            return len(self.data)


class FakeStore(UnbatchedFakeStore):
    def append(self, key, value):
        with self._changed:
            self._log("append")
            self.data[key] = self.data.get(key, b"") + (value if isinstance(value, bytes) else str(value).encode())
            self._changed.notify_all()

    def multi_get(self, keys):
        with self._changed:
            self._log("multi_get", len(keys))
            self._wait_for(list(keys), self.timeout)
            return [self.data[k] for k in keys]

    def multi_set(self, keys, values):
        with self._changed:
            self._log("multi_set", len(keys))
            for k, v in zip(keys, values):
                self.data[k] = v if isinstance(v, bytes) else str(v).encode()
            self._changed.notify_all()
