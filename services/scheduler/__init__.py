"""kvmesh scheduler: worker registry, global KV block index, routing policies, admission queue."""
