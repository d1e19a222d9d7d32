"""The job's c10d store, as both modes use it."""
