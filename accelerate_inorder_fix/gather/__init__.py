"""Gather mode: each rank's in_order record goes through the job's c10d store to the main process.

`collector` is this process's part (a rank's post; the main process's blocks); `queues` the ranks'
queues in the store; `records` a record on the wire; `collapse` identical records as one line. The
protocol: docs/gather-mode.md.
"""
