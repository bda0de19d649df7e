"""A step's integer inputs, built on the host and uploaded to the device with one copy."""

from __future__ import annotations

import torch


class Staging:
    """Collects named int64 arrays; `upload` returns them on the device.

    On CUDA they are packed into one pinned host buffer and sent with a single non-blocking copy
    (no host sync); on CPU the host tensors are used as they are.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._names: list[str] = []
        self._parts: list[torch.Tensor] = []

    def add(self, name: str, values: list[int] | torch.Tensor) -> None:
        t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.long)
        self._names.append(name)
        self._parts.append(t)

    def upload(self) -> dict[str, torch.Tensor]:
        if self.device.type == "cpu":
            return dict(zip(self._names, self._parts))
        sizes = [p.numel() for p in self._parts]
        host = torch.empty(sum(sizes), dtype=torch.long, pin_memory=True)
        torch.cat([p.reshape(-1).long() for p in self._parts], out=host)
        flat = host.to(self.device, non_blocking=True)
        out = {}
        for name, part, piece in zip(self._names, self._parts, flat.split(sizes)):
            out[name] = piece.view(part.shape)
        return out
