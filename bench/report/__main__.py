"""python -m bench.report: see bench/report/cli.py."""

from bench.report.cli import main

raise SystemExit(main())
