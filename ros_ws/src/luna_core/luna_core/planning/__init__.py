"""Motion planning: shared PDM-style scorer, proposals, Diffusion-ES, decision-guided selection."""
