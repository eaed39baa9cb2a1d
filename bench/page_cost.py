"""What the chat page costs the browser, measured in Chromium itself.

    python bench/page_cost.py

tests/browser/browser_cost.py's `measure` (idle after a short reply in each tab, four tabs streaming,
Stop's time to the server) on its seeded hour-like session of forty messages; the tiny model's
replies are noise: this measures the page, not the words. tests/browser/test_ui_page_cost.py asserts
the goals (idle 2%, streaming 50%, Stop 200 ms) on the same measure. Writes
bench/results/page-cost-<time>.json with the load average beside the figures.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
sys.path[:0] = [TESTS, os.path.join(TESTS, "browser")]    # helpers, and the browser tests' own
from browser_cost import measure_session  # noqa: E402
from machine import write_results  # noqa: E402


def main() -> None:
    result = measure_session(Path(tempfile.mkdtemp(prefix="page-cost-")), start_timeout=900)
    result["load_average_1min"] = os.getloadavg()[0]
    print(f"idle {100 * result['idle_core_share']:.1f}% (median; mean "
          f"{100 * result['idle_core_share_mean']:.1f}%) · 4 tabs streaming "
          f"{100 * result['streaming_4_tabs_core_share']:.1f}% of a core · Stop reached the "
          f"server in {1000 * result['stop_to_server_s']:.0f} ms (median of "
          f"{', '.join(f'{1000 * t:.0f}' for t in result['stop_to_server_each_s'])})")
    write_results("page-cost", result)


if __name__ == "__main__":
    main()
