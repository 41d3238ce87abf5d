"""Run GPU work under Hugging Face ZeroGPU when the app is on a ZeroGPU Space, and unchanged everywhere else.

On a ZeroGPU Space a GPU is attached only while a function decorated with `spaces.GPU` runs; the `spaces`
package (preinstalled there) wraps plain functions and generator functions alike, so a streaming Gradio handler
keeps streaming. Off ZeroGPU `spaces.GPU` is a no-op, and where `spaces` is not installed at all `gpu` returns
the function itself.

Things to know when decorating a handler (they come from how ZeroGPU works, not from this module):

- `spaces` must be imported before anything initializes CUDA, so import this module at the top of app.py.
- The decorated call runs in a forked worker: arguments and yielded/returned values are pickled, and changes the
  function makes to objects of the main process (a decoder kept in session state, a cache) do not come back.
  Decorate functions that take plain inputs and yield plain outputs (HTML, figures, dicts).
- `duration` is the longest the call may hold the GPU, in seconds (int, `datetime.timedelta`, or a function of
  the handler's own arguments returning seconds); shorter requests get GPUs sooner.
"""

from __future__ import annotations

import importlib
import inspect
import os
from typing import Any, Callable

DEFAULT_DURATION = 60  # spaces' own default; a 256-token run of the default pair on a ZeroGPU slice fits easily


def _import_spaces():
    """The `spaces` module, or None where it is not installed (anything but a Hugging Face Space)."""
    try:
        return importlib.import_module("spaces")
    except ImportError:
        return None


# Imported as early as possible: on ZeroGPU, `spaces` refuses to start once CUDA has been initialized.
_import_spaces()


def zerogpu_active() -> bool:
    """True on a ZeroGPU Space (the platform sets SPACES_ZERO_GPU; parsed the way `spaces` parses it)."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


def gpu(fn: Callable | None = None, *, duration: Any = DEFAULT_DURATION) -> Callable:
    """Decorator: `@gpu` or `@gpu(duration=120)`.

    With `spaces` importable, returns `spaces.GPU(duration=duration)(fn)`; otherwise returns `fn` unchanged.
    Async functions are refused everywhere, because ZeroGPU cannot run them and the failure would otherwise
    show up only after deploying.
    """
    if fn is None:
        return lambda f: gpu(f, duration=duration)
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"{getattr(fn, '__name__', fn)!r} is async; ZeroGPU (spaces.GPU) only runs plain and generator functions"
        )
    spaces = _import_spaces()
    if spaces is None:
        return fn
    return spaces.GPU(duration=duration)(fn)
