"""The stages of one run, in the order the benchmark flow runs them: export, correctness, accuracy, the perf_analyzer
sweeps, the artifact store, and the run's bookkeeping (tracker)."""
