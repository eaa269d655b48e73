"""`python -m benchmarks`: run the benchmarks and rewrite RESULTS.md (see `benchmarks/cli.py` for flags)."""

import sys

from benchmarks.cli import main

sys.exit(main())
