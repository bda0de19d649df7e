"""The decode worker: receives pushed KV, runs continuous-batching decode, streams tokens."""
