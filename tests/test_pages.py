"""Resident pages of file-mapped weights (specdec.models.pages, prepack.drop_plain_pages): handed back only where
they read back as the same bytes -- a clean private file mapping -- and never for anonymous memory or a mapping with
a written page; the process's RSS sheds them and the tensor's values are unchanged when read again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.models.pages import clean_file_mappings, drop_resident

MIB = 2**20
pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _mapped(tmp_path, name="w.safetensors", mib=64) -> tuple[torch.Tensor, torch.Tensor]:
    source = torch.randn(mib * MIB // 4 // 1024, 1024)
    save_file({"w": source, "b": torch.randn(7)}, str(tmp_path / name))
    return load_file(str(tmp_path / name))["w"], source


def test_a_file_mapped_tensor_sheds_its_pages_and_reads_back_the_same(tmp_path):
    w, source = _mapped(tmp_path)
    assert torch.equal(w, source)  # every page read: resident now
    before = _rss()
    dropped = drop_resident([w])
    after = _rss()
    assert dropped >= 63 * MIB
    assert before - after >= 48 * MIB, (before, after)
    assert torch.equal(w, source)  # faulted back in from the file, the same bytes


def test_anonymous_memory_and_a_written_mapping_are_left_alone(tmp_path):
    anon = torch.randn(4 * MIB // 4)
    copy = anon.clone()
    assert drop_resident([anon]) == 0 and torch.equal(anon, copy)
    w, source = _mapped(tmp_path, "written.safetensors", mib=8)
    w[0, 0] = 123.0  # a copy-on-write page: dropping it would bring back the file's value
    assert drop_resident([w]) == 0
    assert w[0, 0] == 123.0 and torch.equal(w[1:], source[1:])
    lo = w.data_ptr()
    assert not any(a <= lo < b for a, b in clean_file_mappings())
