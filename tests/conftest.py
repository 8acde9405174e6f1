"""Shared fixtures: small models loaded once per test session.

Tests run with jaxtyping runtime shape checking on (see pyproject's pytest addopts). Fixtures
are session-scoped, so a test must leave no hook behind (mechsink's own code guarantees that).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config: pytest.Config) -> None:
    """mechsink's own warnings are errors here: a test that expects one says so
    (``pytest.warns``). Added now, not in pyproject's ``filterwarnings``, because naming the
    class there would import mechsink before jaxtyping installs its runtime checks."""
    config.addinivalue_line("filterwarnings", "error::mechsink.errors.MechsinkWarning")


@pytest.fixture(scope="session")
def gpt2_tiny():
    """random:gpt2-tiny, seed 0 (2 layers, d_model 64, 4 heads, learned query bias)."""
    from mechsink import load_model

    return load_model("random:gpt2-tiny", device="cpu", seed=0)


@pytest.fixture(scope="session")
def llama_tiny():
    """random:llama-tiny, seed 0 (2 layers, d_model 64, 4 query heads / 2 KV heads, RoPE)."""
    from mechsink import load_model

    return load_model("random:llama-tiny", device="cpu", seed=0)


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (slow tests only: decoded from GGUF on first use)."""
    from mechsink import load_model

    return load_model("smollm2-135m", device="cpu")
