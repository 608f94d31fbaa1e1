"""The core every layer stands on: errors, enums, model I/O, runtimes, settings, run layout."""
