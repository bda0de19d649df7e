"""The prefill worker: computes prompt KV (reusing cached prefixes) and pushes it to a decode worker."""
