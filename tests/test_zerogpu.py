"""ui.zerogpu.gpu: unchanged without `spaces`, wrapped by spaces.GPU(duration=...) with it."""

from __future__ import annotations

import inspect
import sys
import types

import pytest

from ui.zerogpu import DEFAULT_DURATION, gpu, zerogpu_active


def plain(x):
    return x * 2


def streaming(n):
    for i in range(n):
        yield i


async def coroutine():
    return 1


class FakeSpaces(types.ModuleType):
    """Stands in for Hugging Face's `spaces`: records each GPU(...) call and wraps like the real one does,
    with a generator wrapper for generator functions (spaces.zero.wrappers.generator_function_wrapper)."""

    def __init__(self):
        super().__init__("spaces")
        self.calls: list[dict] = []

    def GPU(self, task=None, *, duration=None, size=None):  # noqa: N802 - the real name
        if task is None:
            return lambda f: self.GPU(f, duration=duration, size=size)
        self.calls.append({"task": task, "duration": duration, "size": size})
        if inspect.isgeneratorfunction(task):

            def gen_wrapper(*args, **kwargs):
                yield from task(*args, **kwargs)

            gen_wrapper.zerogpu = True
            return gen_wrapper

        def wrapper(*args, **kwargs):
            return task(*args, **kwargs)

        wrapper.zerogpu = True
        return wrapper


@pytest.fixture
def no_spaces(monkeypatch):
    monkeypatch.setitem(sys.modules, "spaces", None)  # `import spaces` now raises ImportError


@pytest.fixture
def fake_spaces(monkeypatch):
    fake = FakeSpaces()
    monkeypatch.setitem(sys.modules, "spaces", fake)
    return fake


# ------------------------------------------------------------------------------------------- without spaces


def test_without_spaces_bare_decorator_returns_the_function(no_spaces):
    assert gpu(plain) is plain
    assert gpu(streaming) is streaming


def test_without_spaces_called_decorator_returns_the_function(no_spaces):
    assert gpu(duration=120)(plain) is plain
    assert list(gpu(duration=5)(streaming)(3)) == [0, 1, 2]


# ---------------------------------------------------------------------------------------------- with spaces


def test_with_spaces_wraps_with_the_default_duration(fake_spaces):
    wrapped = gpu(plain)
    assert wrapped is not plain and wrapped.zerogpu
    assert wrapped(21) == 42
    assert fake_spaces.calls == [{"task": plain, "duration": DEFAULT_DURATION, "size": None}]


def test_with_spaces_passes_the_duration(fake_spaces):
    @gpu(duration=120)
    def handler(x):
        return x + 1

    assert handler(1) == 2
    assert [c["duration"] for c in fake_spaces.calls] == [120]


def test_with_spaces_generator_functions_still_stream(fake_spaces):
    wrapped = gpu(duration=90)(streaming)
    assert inspect.isgeneratorfunction(wrapped)
    assert list(wrapped(4)) == [0, 1, 2, 3]
    assert fake_spaces.calls[0]["task"] is streaming and fake_spaces.calls[0]["duration"] == 90


def test_dynamic_duration_is_passed_through(fake_spaces):
    def estimate(n):
        return 10 + n

    gpu(duration=estimate)(streaming)
    assert fake_spaces.calls[0]["duration"] is estimate


# ------------------------------------------------------------------------------------------------ both paths


@pytest.mark.parametrize("env", ["no_spaces", "fake_spaces"])
def test_async_functions_are_refused(request, env):
    request.getfixturevalue(env)
    with pytest.raises(TypeError, match="async"):
        gpu(coroutine)


@pytest.mark.parametrize(
    "value, expected", [("true", True), ("1", True), ("True", True), ("false", False), ("", False)]
)
def test_zerogpu_active_reads_the_platform_flag(monkeypatch, value, expected):
    monkeypatch.setenv("SPACES_ZERO_GPU", value)
    assert zerogpu_active() is expected


def test_zerogpu_inactive_without_the_flag(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert zerogpu_active() is False
