"""Modules for the steps collector's in-process tests (tests/unit)."""

from __future__ import annotations

import time

import torch
import torch.nn as nn


class Slow(nn.Module):
    """A module whose forward takes a known time (a sleep), so the phase it is charged to shows."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return self.layer(x)
