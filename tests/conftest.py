"""Shared fixtures: the real embedded model (loaded once per session) and paths to shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def shared_data() -> Path:
    return Path(os.environ.get("DISTILL_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct, in process (converted once from the packaged GGUF)."""
    from distill.config import ModelSpec
    from distill.llm import build_chat

    return build_chat(ModelSpec(backend="transformers", model="smollm2-135m-instruct"))


@pytest.fixture
def shared_data_dir() -> Path:
    d = shared_data()
    if not d.exists():
        pytest.skip(f"shared data not found at {d} (set DISTILL_SHARED_DATA)")
    return d
