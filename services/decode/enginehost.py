"""`python -m kvmesh.decode.enginehost --fd N`: the decode worker's engine process
(setting `engine_process`; started by the worker, never by hand)."""

from __future__ import annotations

import sys

from kvmesh.worker.enginehost import main

from .commands import COMMANDS
from .config import DecodeSettings

if __name__ == "__main__":
    sys.exit(main(DecodeSettings, COMMANDS))
