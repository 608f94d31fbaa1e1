"""The team side: the local stack, the GPU pools and their setup, the Prefect API, submitting runs and the matrix's
child runs."""
