"""The KV cache store: a tiered (memory → disk) block store keyed by chained block hash."""
