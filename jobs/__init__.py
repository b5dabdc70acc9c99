"""Fine-tune, quantize and dataset jobs on the Huey queue  (job kinds register in jobs/registry.py)."""
