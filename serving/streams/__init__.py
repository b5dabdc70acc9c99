"""Resumable streams (`store.Streams`): generations that outlive their
request, replayable from any byte offset, durable across restarts."""
