"""The worker framework shared by the prefill and decode workers: the engine thread
(`EngineLoop`), worker settings, heartbeats and the process shell (`app`). The only layer besides
the workers themselves that imports the engine."""
