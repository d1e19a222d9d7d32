"""Gather mode: each rank's in_order record goes through the job's c10d store to the main process.

`side` is this process's part (post, or collect and emit); `collector` the main process's block
assembly; `queues` the ranks' queues in the store; `copies` the shared-slot copies; `records` the
wire format.
"""
