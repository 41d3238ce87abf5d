"""Exceptions with messages meant for people: the CLI and the app show them as they are."""


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
