"""Fine-tune, quantize and dataset jobs on the Huey queue (see the jobs issue)."""
