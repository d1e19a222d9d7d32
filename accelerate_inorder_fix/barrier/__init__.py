"""Barrier mode: each rank prints through its own handlers, in turns, after the call is checked in."""
