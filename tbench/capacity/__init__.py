"""Capacity planning: the sustainable request rate under a latency SLO, the instances a traffic needs, and its cost."""
