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


class HeadEnsemble(nn.Module):
    """Several decision heads on the same h_{i*} (one forward pass of the base), each trained on its own:
    pi_hat is the mean of their distributions. The members may read different parts of the scene values;
    the ensemble reads them all (``luna_core.scene.HEAD_SCENE_PARTS["all-timing"]``) and hands each member its
    part. Why: heads that agree equally well with the teacher err on different states (docs/student.md,
    "An ensemble of heads"), and the mean is more even where they disagree.

    ``forward`` returns log pi_hat, so that a softmax of it (``DualHeadStudent.dpp_probabilities``) is pi_hat."""

    def __init__(self, d_model: int, hidden: int, num_actions: int, member_scene_dims: list[int]) -> None:
        from luna_core.scene import head_scene_part
        from luna_core.student.config import StudentConfig

        super().__init__()
        if len(member_scene_dims) < 2:
            raise ValueError(f"an ensemble needs at least 2 heads, got {len(member_scene_dims)}")
        self.d_model = d_model
        self.scene_dim = StudentConfig.ensemble_scene_dim(member_scene_dims)
        self.members = nn.ModuleList(DecisionHead(d_model, hidden, num_actions, dim) for dim in member_scene_dims)
        self.parts = [list(head_scene_part(dim)) if dim else None for dim in member_scene_dims]

    def forward(self, h: torch.Tensor, scene: torch.Tensor | None = None) -> torch.Tensor:
        if self.scene_dim and (scene is None or scene.shape[-1] != self.scene_dim):
            got = "none" if scene is None else f"{scene.shape[-1]} values"
            raise ValueError(f"this ensemble of decision heads reads {self.scene_dim} scene values beside h_i*, "
                             f"got {got}")
        probs = [torch.softmax(m(h, scene[..., part] if part else None), dim=-1)
                 for m, part in zip(self.members, self.parts)]
        return torch.log(torch.stack(probs).mean(dim=0))
