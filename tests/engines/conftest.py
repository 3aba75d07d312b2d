"""Fixtures shared by the adapter tests."""

import pytest


@pytest.fixture
def past_env_checks(monkeypatch, request):
    """Skip the package and GPU checks of the test module's ``adapter``, to reach the knob checks."""
    adapter = request.module.adapter
    monkeypatch.setattr(adapter, "require_module", lambda *a: None)
    monkeypatch.setattr(adapter, "require_cuda", lambda *a: None)
