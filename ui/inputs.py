"""gr.Number and gr.Slider that refuse what the API can send but the browser never does, with a message.

From the browser these fields only ever hold numbers. Through the API (gradio_client, raw HTTP) they can receive
strings, booleans, NaN, infinities and 40-digit integers. Gradio's own preprocessing then fails with a TypeError
or ValueError, which reaches the caller only as "the app has raised an exception" (with a traceback in the log).
These subclasses check the payload first and answer with a gr.Error naming the field; valid numbers go on to
Gradio's own preprocessing unchanged. The class names stay Number and Slider, because Gradio picks the browser
component by class name.
"""

from __future__ import annotations

import math

import gradio as gr


def _field(component) -> str:
    return component.label or component.elem_id or "a number field"


def _shown(x) -> str:
    try:
        return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else repr(x)[:40]
    except OverflowError:  # an integer too large for a float
        return f"a {len(str(abs(x)))}-digit number"


def check_number(component, payload, minimum=None, maximum=None) -> None:
    """Raise gr.Error unless payload is None or a finite number within [minimum, maximum]."""
    if payload is None:
        return
    name = _field(component)
    if isinstance(payload, bool) or not isinstance(payload, (int, float)):
        raise gr.Error(f"{name} must be a number, got {_shown(payload)}", print_exception=False)
    if isinstance(payload, float) and not math.isfinite(payload):
        raise gr.Error(f"{name} must be a finite number, got {payload}", print_exception=False)
    if minimum is not None and payload < minimum:
        raise gr.Error(f"{name}: {_shown(payload)} is less than the minimum, {_shown(minimum)}",
                       print_exception=False)
    if maximum is not None and payload > maximum:
        raise gr.Error(f"{name}: {_shown(payload)} is more than the maximum, {_shown(maximum)}",
                       print_exception=False)


class Number(gr.Number):
    def preprocess(self, payload):
        check_number(self, payload, self.minimum, self.maximum)
        return super().preprocess(payload)


class Slider(gr.Slider):
    def preprocess(self, payload):
        if payload is None:
            raise gr.Error(f"{_field(self)} is empty; send a number", print_exception=False)
        check_number(self, payload, self.minimum, self.maximum)
        return super().preprocess(payload)
