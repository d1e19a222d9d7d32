"""The job's c10d store, as both modes use it.

`connection` reaches it (a client per thread, keys under a prefix); `teardown` ends the session before
the process group is destroyed; `hooks` wraps torch's function for it; `errors` tells a wait's deadline
from a failed store.
"""
