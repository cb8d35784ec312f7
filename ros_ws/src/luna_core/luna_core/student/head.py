"""f_theta_DPP: the decision-probability head (LUNA-AD Eq. 16), a 2-layer MLP on h_{i*}."""

from __future__ import annotations

import torch
from torch import nn


class DecisionHead(nn.Module):
    """Maps the commitment hidden state (..., d_model) to logits over the 10 actions."""

    def __init__(self, d_model: int, hidden: int = 1024, num_actions: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, num_actions))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h)
