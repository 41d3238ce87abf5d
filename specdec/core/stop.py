"""The one stop rule: a text ends after its first end-of-text token, or when the token budget is spent.

Every loop (the speculative decoder, the plain loop, the batched loop, the race) and every copying drafter cuts
its tokens here, and reports why it stopped with a `StopReason`; `STOP_LABELS` is how people read it.
"""

from __future__ import annotations

from enum import Enum


class StopReason(str, Enum):
    """Why a text ended. A str, so it compares equal to (and serializes as) the plain strings traces store."""

    EOS = "eos"  # the model wrote an end-of-text token
    MAX_NEW_TOKENS = "max_new_tokens"  # the token budget is spent

    def __str__(self) -> str:
        return self.value


STOP_LABELS = {StopReason.EOS: "end of text", StopReason.MAX_NEW_TOKENS: "token limit reached"}


def stop_label(reason) -> str:
    """The words for a stop reason (a StopReason or its string), '' for none."""
    if reason is None or reason == "":
        return ""
    try:
        return STOP_LABELS[StopReason(reason)]
    except ValueError:
        return str(reason)


def cut_at_stop(tokens: list[int], stop_ids, budget: int | None = None) -> tuple[list[int], StopReason | None]:
    """`tokens` cut after the first of `stop_ids` and then to `budget` tokens (None: no budget); and why the text
    ends there (None: it goes on). `budget` counts the tokens the text may still take, so a cut to exactly the
    budget is MAX_NEW_TOKENS."""
    for n, t in enumerate(tokens):
        if t in stop_ids and (budget is None or n < budget):
            return list(tokens[: n + 1]), StopReason.EOS
    if budget is not None and len(tokens) >= budget:
        return list(tokens[:budget]), StopReason.MAX_NEW_TOKENS
    return list(tokens), None
