"""A hook on one of torch.distributed's functions: callbacks run around it, the wrapper installed once.

`teardown` runs its callbacks before `destroy_process_group`. The hook is a wrapt wrapper on the name in `torch.distributed` and in `distributed_c10d` (the names user
code and accelerate call); a name bound earlier (`from torch.distributed import ...`) keeps the
original. `reset` takes the wrappers out again (`accelerate_inorder_fix.testing.reset`).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import wrapt


_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")
Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


class TorchHook:
    """Callbacks for one function of torch.distributed, and the wrappers that run them.

    Args:
        name: the function's name in `torch.distributed` (`"destroy_process_group"`).
        wrapper: the wrapt wrapper function, which calls `callbacks()` where it must.
    """

    def __init__(self, name: str, wrapper: Wrapper) -> None:
        self.name = name
        self._wrapper = wrapper
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._installed: list[tuple[Any, Any]] = []  # (module, our wrapper there)

    def add(self, callback: Callable[[], None]) -> None:
        """Keep `callback` (once) and install the wrapper where torch is loaded and it is not yet."""
        with self._lock:
            if callback not in self._callbacks:
                self._callbacks.append(callback)
            for module_name in _MODULES:
                module = sys.modules.get(module_name)
                current = getattr(module, self.name, None)
                if module is None or current is None or any(m is module and w is current for m, w in self._installed):
                    continue
                wrapper = wrapt.FunctionWrapper(current, self._wrapper)
                setattr(module, self.name, wrapper)
                self._installed.append((module, wrapper))

    def callbacks(self) -> list[Callable[[], None]]:
        """The callbacks now, a copy: one may add another while they run."""
        with self._lock:
            return list(self._callbacks)

    def forget(self, callback: Callable[[], None]) -> None:
        """Drop `callback` (a session let go of); the wrappers stay for the others."""
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def reset(self) -> None:
        """No callbacks, and torch's own function back wherever our wrapper is still the one in place."""
        with self._lock:
            for module, wrapper in self._installed:
                original = wrapper.__wrapped__
                if getattr(module, self.name, None) is wrapper:
                    setattr(module, self.name, original)
            self._callbacks.clear()
            self._installed.clear()
