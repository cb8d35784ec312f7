"""BEV pictures of a run: the whole run as a PNG, an animation as a GIF, at-fault collisions marked."""

import numpy as np
from PIL import Image

from luna_bridge.baselines import make_eval_planner
from luna_bridge.metrics import score_log
from luna_bridge.render import render_gif, render_png
from luna_bridge.sim import SimulationConfig, simulate
from tests.scenario_samples import blocked_lane_scenario

PURE_RED = np.array([255, 0, 0])  # the collision marker's colour; nothing else in these pictures is pure red


def _red_pixels(path) -> int:
    rgb = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3)
    return int(np.all(np.abs(rgb.astype(int) - PURE_RED) < 8, axis=1).sum())


def test_png_marks_the_at_fault_collision_and_gif_animates_the_run(tmp_path):
    # The expert drives through the car parked in its lane: log replay collides, at fault.
    scenario = blocked_lane_scenario(6.0)
    log = simulate(scenario, make_eval_planner("log-replay", scenario), reactive=False, config=SimulationConfig())
    score = score_log(log)
    assert score.metrics["no_ego_at_fault_collisions"].statistics["number_of_at_fault_collisions"] == 1
    marked, plain = render_png(log, tmp_path / "marked.png", score=score), render_png(log, tmp_path / "plain.png")
    assert _red_pixels(marked) > 20 and _red_pixels(plain) == 0
    gif = Image.open(render_gif(log, tmp_path / "run.gif", every=10, score=score))
    assert gif.n_frames == len(log.ego) // 10 + 1  # every 10 steps and the last one
