"""The job's c10d store, as both modes use it.

`connection` opens it (a connection of our own) and reads without waiting; `mode` is the main
process's mode key; `writer` the one background writer; `teardown` stops it before the process group
is destroyed; `errors` tells a wait's deadline from a failed store.
"""
