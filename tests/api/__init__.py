"""The HTTP surface as a whole: errors, access, limits, hardening, streams, the cache routes, media and adapters."""
