"""Barrier mode: each rank prints through its own handlers, in rank order, its turn handed over through the store.

One call, in the order it runs: `side` (`BarrierSide.call`), `checkin` (the verdict: go or skip),
`handoff` (the turns after a `go`), `turns` (the one emit; the calls without a store).
"""
