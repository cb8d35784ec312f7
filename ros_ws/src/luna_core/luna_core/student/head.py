"""f_theta_DPP: the decision-probability head (LUNA-AD Eq. 16), a 2-layer MLP on h_{i*}.

With ``scene_dim`` > 0 the head also reads the numeric scene vector xi_t (``luna_core.scene.scene_vector``,
the vector the memory bank retrieves by), standardised with the training rows' mean and scale (buffers,
saved with the weights), beside h_{i*}. Why: the frozen base's state at the commitment token carries the
descriptor's numbers less precisely than the vector itself (docs/student.md, "The scene vector beside
h_{i*}"); the language model still reads the prompt and the retrieved examples.
"""

from __future__ import annotations

import torch
from torch import nn


class DecisionHead(nn.Module):
    """Maps the commitment hidden state (..., d_model) [and the scene vector (..., scene_dim)] to logits
    over the 10 actions."""

    def __init__(self, d_model: int, hidden: int = 1024, num_actions: int = 10, scene_dim: int = 0) -> None:
        super().__init__()
        self.d_model = d_model
        self.scene_dim = scene_dim
        self.net = nn.Sequential(nn.Linear(d_model + scene_dim, hidden), nn.GELU(), nn.Linear(hidden, num_actions))
        if scene_dim:
            self.register_buffer("scene_mean", torch.zeros(scene_dim))
            self.register_buffer("scene_scale", torch.ones(scene_dim))

    def set_scene_normalisation(self, vectors: torch.Tensor) -> None:
        """Standardise the scene vector with the mean and scale of these (n, scene_dim) training rows (a
        feature constant over them keeps scale 1: it carries nothing to scale)."""
        scale = vectors.float().std(dim=0)
        self.scene_mean.copy_(vectors.float().mean(dim=0))
        self.scene_scale.copy_(torch.where(scale > 1e-6, scale, torch.ones_like(scale)))

    def forward(self, h: torch.Tensor, scene: torch.Tensor | None = None) -> torch.Tensor:
        if self.scene_dim:
            if scene is None:
                raise ValueError(f"this decision head reads the scene vector ({self.scene_dim} values) beside "
                                 "h_i*: pass scene")
            if scene.shape[-1] != self.scene_dim:
                raise ValueError(f"scene vector of {scene.shape[-1]} values, the head reads {self.scene_dim}")
            z = (scene.to(h.dtype) - self.scene_mean) / self.scene_scale
            h = torch.cat([h, z.expand(*h.shape[:-1], self.scene_dim)], dim=-1)
        return self.net(h)
