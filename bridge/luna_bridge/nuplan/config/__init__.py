"""Hydra search-path root for the nuPlan devkit (``hydra.searchpath=[pkg://luna_bridge.nuplan.config, ...]``)."""
