"""Exceptions with messages meant for people: the CLI and the app show them as they are."""

import numbers


class SpecDecError(Exception):
    """Base class for every error specdec raises on purpose."""


class InvalidInputError(SpecDecError, ValueError):
    """A setting or prompt the decoder cannot work with (empty prompt, gamma out of range, ...)."""


class ModelLoadError(SpecDecError):
    """A model could not be found or loaded (unknown id, no hub access, corrupt files)."""


class UnsupportedModelError(ModelLoadError):
    """The model loads but cannot take part in speculative decoding (not a causal LM, needs remote code)."""


class VocabularyMismatchError(ModelLoadError):
    """Draft and target do not share a vocabulary, so q and p would live on different token sets."""


class TraceError(SpecDecError, ValueError):
    """A recorded trace file is malformed or from an unknown schema version."""


def short_repr(value, limit: int = 60) -> str:
    """A value as a message quotes it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def whole_number(value, name: str, lo: int, hi: int | None = None, error: type[SpecDecError] = InvalidInputError,
                 integral_floats: bool = False, got: str | None = None) -> int:
    """The one whole-number check for everything people give specdec (settings, the API, the CLI, traces, the lab):
    an int (never a bool) from lo to hi (no upper bound for None), or `error` saying so. `integral_floats` also
    takes 3.0 (what a number box sends); `got` replaces the quoted value (e.g. a trace's JSON spelling)."""
    if integral_floats and isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo or (hi is not None and value > hi):
        span = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
        raise error(f"{name} must be a whole number {span}, got {got if got is not None else short_repr(value)}")
    return int(value)
