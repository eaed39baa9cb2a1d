"""Real parts of the machine a test needs (Chromium, the bundled SmolLM2 GGUF, Playwright):
skip locally, fail in CI.

Tests ask for a part through `require_part`, the one place that decides what a missing part
means: a skip naming the part and how to get it, or, with LOCALPAGED_REQUIRE_ALL=1 (set by
.ci/run), a failure naming it, so that CI cannot pass by skipping. conftest.py hands it out as
the `require_part` fixture.
"""

import os

import pytest

REQUIRE_ALL_ENV = "LOCALPAGED_REQUIRE_ALL"


def require_part(name: str, available: bool, how: str) -> None:
    """Skip (or, under LOCALPAGED_REQUIRE_ALL=1, fail) unless `available`; `how` says how to get
    the part."""
    if available:
        return
    message = f"missing part: {name} ({how})"
    if os.environ.get(REQUIRE_ALL_ENV) == "1":
        pytest.fail(f"{message}; {REQUIRE_ALL_ENV}=1 makes a missing part a failure",
                    pytrace=False)
    pytest.skip(message)
