"""Pure logic of the check-in's reads: what another process left in the store never raises into the caller.

A verdict, a marker or a counter is read from the job's store, where anyone with access can write. A forged
verdict nested deeper than the JSON decoder's recursion limit, or a call number in non-ASCII digits
(`'²'.isdigit()` is True, `int('²')` raises), must read as junk: a skip named "damaged", or a marker of no
call. On one in-memory store (`testing.InMemoryStore`, through a `Connection` as the session gives it), one rank
of two checks in alone.
"""

from accelerate_inorder_fix.barrier import checkin
from accelerate_inorder_fix.store.connection import Connection
from accelerate_inorder_fix.testing import InMemoryStore


SITE = ("train.py", "step", 10)
T = 0.2


def alone(store):
    """Rank 0 of 2 checks in at SITE, through a `Connection` to `store` (what `CheckIn` is given)."""
    return checkin.CheckIn(Connection(store, "", T), 0, 2)


def first_verdict(side):
    """The verdict of the side's first call at SITE."""
    return side.verdict(checkin.Call(checkin.site_name(SITE), 1), side.clock() + T, T)[1]


def test_a_forged_deeply_nested_verdict_is_a_damaged_skip_not_a_recursion_error():
    store = InMemoryStore()
    forged = checkin.SKIP + b'{"missing": ' + b"[" * 200_000
    store.set(checkin.Call(checkin.site_name(SITE), 1).key, forged)
    assert checkin.Verdict.decode(forged) == checkin.Verdict(False, checkin.Why.DAMAGED)
    verdict = first_verdict(alone(store))  # f0a0bfc: RecursionError out of the check-in
    assert not verdict.go and verdict.why == "damaged"


def test_a_call_number_in_non_ascii_digits_is_no_call():
    assert checkin.Call.parse("train.py:3:f/²") is None  # f0a0bfc: ValueError from int('²')
    assert checkin.Call.parse("train.py:3:f/12") == checkin.Call("train.py:3:f", 12)


def test_a_marker_in_non_ascii_digits_leaves_the_wait_and_its_timeout_alone():
    """Rank 1's marker names a call '²' at another site: at its deadline rank 0 looks at it for a wait-for
    cycle, finds no call, and gives its own up, naming rank 1 (f0a0bfc: a "store" skip, from the
    ValueError, which named nobody)."""
    store = InMemoryStore()
    store.set(checkin.MARK + "1", "other.py:3:f/²".encode())
    store.set("c/other.py:3:f", "²".encode())
    side = alone(store)
    verdict = first_verdict(side)
    assert (verdict.go, verdict.why, sorted(verdict.missing)) == (False, "timeout", [1])
