"""The load generator: perf_analyzer's command line and output (perf_analyzer.py), and whether a point kept up with
the load it was given (behind.py)."""
