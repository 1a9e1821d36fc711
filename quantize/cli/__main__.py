"""`python -m quantize.cli`: the `quantize` command (as the benchmarks run it)."""

from . import main

main()
