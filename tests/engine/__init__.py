"""inference/engine/ in this process: batching, sampling, the prompt cache, speculation, loading, streams' store."""
