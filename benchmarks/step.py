"""`python -m benchmarks.step [options]` = `rookworld-debug bench [options]` (code: rookworld_debug/lab/bench.py)."""
import sys

from rookworld_debug.lab.bench import main

if __name__ == "__main__":
    sys.exit(main())
