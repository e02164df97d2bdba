"""Shared fixtures. Under ``CI=true`` a skipped test fails: a green CI run means the real FUSE,
tmpfs and torchvision paths ran. Only tests marked ``cuda`` may skip there (CI has no GPU)."""

from __future__ import annotations

import os

import pytest

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if CI and report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("cuda") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every non-CUDA path must run: {reason}"
