"""kvmesh canary: replays mirrored traffic on a candidate pool, compares with production, promotes or rolls back."""
