"""One module per stage: plain functions do the work, the @task wrappers at the bottom stay thin."""
