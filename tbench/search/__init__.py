"""The configuration search: strategies, the search surface, evaluation on a Triton server."""
