"""Jobs: kinds, the worker, quantize and fine-tune end to end."""
