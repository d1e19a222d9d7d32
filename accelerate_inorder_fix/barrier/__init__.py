"""Barrier mode: each rank prints through its own handlers, in rank order, between upstream's barriers.

`turns` is one call (rank 0's turn, the check-in, the other turns); `checkin` the protocol that lets
the barriers run only when every rank has made the call; `side` this process's check-in and its
warnings.
"""
