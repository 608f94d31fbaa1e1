"""The history of scheduled runs: series of one measured thing over time, their step changes
(tbench.history.detect), what changed underneath them, and a static site of it all."""
