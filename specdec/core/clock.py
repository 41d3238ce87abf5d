"""One clock for every timed section: on a GPU it waits for queued work first, so a reading measures the work."""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a timer read after it measures the work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Synchronized wall-clock laps in milliseconds: `lap()` is the time since the previous lap (or the start),
    `total()` the time since the start."""

    def __init__(self, device: torch.device):
        self.device = device
        synchronize(device)
        self.start = self.last = time.perf_counter()

    def lap(self) -> float:
        synchronize(self.device)
        now = time.perf_counter()
        ms, self.last = (now - self.last) * 1e3, now
        return ms

    def total(self) -> float:
        synchronize(self.device)
        return (time.perf_counter() - self.start) * 1e3
