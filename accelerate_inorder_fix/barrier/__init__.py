"""Barrier mode: each rank prints through its own handlers, in rank order, its turn handed over through the store.

One call, in the order a reader follows it: `side` (`BarrierSide.call`: rank 0's turn, the check-in, a
skip's emit or the go's turns), `checkin` (the protocol that lets the turns run only when every rank
has made the call), `handoff` (the turns after a `go`, point to point), `turns` (the emit, at most once;
the calls without a store: plain barriers, or at once).
"""
