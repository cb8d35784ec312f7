"""What the teacher says, frame by frame, from the states a run visited: a collect run's records beside the
frames they label (ego speed, the descriptor's recent decisions and light), one line per frame. With
on-policy frames of one scenario it shows where a student's decisions part from the teacher's; it is how
docs/benchmarks.md "Session 27" reads `hard_starting_right_turn_00` (a diagnosis: an evaluation scenario
is labelled to be read, never put in a training bank):

    luna-offline frames --scenario <scenario file> --on-policy luna --student <student> --k 3 \
        --threads 1 --out <diag>/frames.jsonl
    luna-offline collect --frames <diag>/frames.jsonl --bank <diag>/bank --run <diag>/run \
        --scorer luna_bridge.action_scorer:make_bundled_bank_scorer --embedder scene-vector --concurrency 1
    .venv/bin/python benchmarks/teacher_timeline.py <diag>/frames.jsonl <diag>/run --actions AK CK SK

Each line: time (s), ego speed (m/s), recent decisions, light state (and the junction's distance), with
``--objects N`` the descriptor's N nearest objects, then the teacher's top three actions with their
probabilities and, for each ``--actions`` code, its rollout score and, when it failed or was held up, why
(the scorer's outcome).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from luna_core.types import ACTION_CODES, SceneDescriptor, TrafficLightPhase
from luna_offline.collect import RECORDS, read_records
from luna_offline.frames import read_frames


def records_by_frame(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The run's records by frame id (the last record of a frame wins, as a retry's would)."""
    if not (run_dir / RECORDS).is_file():
        raise SystemExit(f"teacher_timeline: {run_dir / RECORDS} does not exist (give the --run folder of a "
                         "collect run)")
    try:
        return {record["frame"]: record for record in read_records(run_dir)}
    except ValueError as exc:
        raise SystemExit(f"teacher_timeline: {exc}") from exc


def top_actions(distribution: list[float], n: int = 3) -> list[tuple[str, float]]:
    """The ``n`` most likely actions with non-zero mass, most likely first."""
    ranked = sorted(zip(ACTION_CODES, distribution), key=lambda pair: -pair[1])
    return [(code, p) for code, p in ranked[:n] if p > 0.0]


def outcome_text(outcome: dict[str, Any]) -> str:
    """Score and, when the rollout was not clean, the scorer's short reason."""
    why = outcome.get("issue", "")
    return f"{outcome['score']:.2f}" + (f" ({why})" if why else "")


def light_name(phase: TrafficLightPhase | None) -> str:
    """The ego lane's light phase as the descriptor holds it ('-' for none)."""
    return "-" if phase is None else phase.name.lower()


def nearest_objects(scene: SceneDescriptor, n: int) -> str:
    """The descriptor's ``n`` nearest objects: id, class, distance (m), lane relation."""
    nearest = sorted(scene.objects, key=lambda o: o.distance)[:n]
    return ", ".join(f"{o.id} {o.object_class.value} {o.distance:.1f} m "
                     f"{o.lane_relation}" for o in nearest)


def timeline(frames_path: Path, run_dir: Path, actions: list[str], objects: int = 0) -> list[str]:
    """One line per frame, by scenario and time; frames the run did not label say so."""
    records = records_by_frame(run_dir)
    lines = []
    for frame in sorted(read_frames(frames_path), key=lambda f: (f.scenario, f.time)):
        record = records.get(frame.id)
        scene = frame.scene
        junction = (f" {scene.junction_distance:.1f} m ahead"
                    if scene.traffic_light is not None and math.isfinite(scene.junction_distance) else "")
        head = (f"{frame.scenario} {frame.time:5.1f} s  v {scene.ego_speed:4.2f} m/s  "
                f"recent {'/'.join(scene.recent_decisions) or '-'}  light {light_name(scene.traffic_light)}{junction}")
        if objects:
            head += f"  [{nearest_objects(scene, objects)}]"
        if record is None:
            lines.append(f"{head}  | not labelled")
            continue
        if not record.get("ok"):
            lines.append(f"{head}  | failed: {record.get('reason', '')}")
            continue
        teacher = " ".join(f"{a} {p:.2f}" for a, p in top_actions(record["distribution"]))
        outcomes = record.get("outcomes", {})
        rollouts = "; ".join(f"{a} {outcome_text(outcomes[a])}" for a in actions if a in outcomes)
        lines.append(f"{head}  | teacher {teacher}  | {rollouts}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("frames", type=Path, help="the frames file the collect run labelled")
    p.add_argument("run", type=Path, help="the collect run folder (--run)")
    p.add_argument("--actions", nargs="+", default=["AK", "CK", "SK"], choices=ACTION_CODES,
                   help="actions whose rollout outcome to show (default AK CK SK)")
    p.add_argument("--objects", type=int, default=0, help="also the descriptor's N nearest objects (default 0)")
    args = p.parse_args()
    print("\n".join(timeline(args.frames, args.run, args.actions, args.objects)))


if __name__ == "__main__":
    main()
