"""``python -m rookworld_debug.report --worker TASK.json``: the per-run worker process the sweep runner starts."""
from __future__ import annotations

import sys

from rookworld_debug.report.runner import _worker_main

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(sys.argv[2]))
    sys.stderr.write("usage: python -m rookworld_debug.report --worker TASK.json "
                     "(sweeps: rookworld-debug report ... / python -m rookworld_debug.report_cli)\n")
    sys.exit(2)
