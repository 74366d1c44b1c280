"""Fixtures of the debias tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def gen(tiny_lm_dir):
    """A Generator over the tiny random Llama (one per test module)."""
    from ragkit.generation import Generator

    return Generator(model=str(tiny_lm_dir), batch_size=16, max_length=1024, show_progress=False)
