"""kvmesh gateway: the OpenAI-compatible REST front end (FastAPI + uvicorn)."""
