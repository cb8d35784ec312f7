"""Write a nuPlan devkit scenario-filter config from a token list (Test14-Hard / Test14-Random).

    python -m luna_bridge.nuplan.scenario_filter ../shared/nuplan/test14_hard_tokens.txt \\
        ~/luna_nuplan_config/scenario_filter/test14_hard.yaml

The filter settings are the ones the Test14 splits were drawn with (``../shared/nuplan/README.md``):
the ``nuplan_challenge`` builder's 15 s threshold between scenarios and invalid goals removed. Put the
output directory's parent on the devkit's hydra search path and select it with
``scenario_filter=test14_hard``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

TOKEN = re.compile(r"^[0-9a-f]{16}$")  # nuPlan lidar_pc tokens: 16 lower-case hex digits


class TokenListError(ValueError):
    """A token file that is empty or holds something that is not a nuPlan scenario token."""


def read_tokens(path: Path) -> list[str]:
    """Tokens one per line (blank lines and ``#`` comments skipped); duplicates are an error."""
    tokens, seen = [], set()
    for n, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not TOKEN.match(line):
            raise TokenListError(f"{path}:{n}: {line!r} is not a 16-hex-digit nuPlan token")
        if line in seen:
            raise TokenListError(f"{path}:{n}: duplicate token {line}")
        seen.add(line)
        tokens.append(line)
    if not tokens:
        raise TokenListError(f"{path}: no tokens")
    return tokens


def scenario_filter_yaml(tokens: list[str]) -> str:
    """The devkit ``ScenarioFilter`` config selecting exactly ``tokens`` (quoted: an all-digit token
    would otherwise load as a number)."""
    lines = ["_target_: nuplan.planning.scenario_builder.scenario_filter.ScenarioFilter", "_convert_: 'all'",
             "scenario_types: null", "scenario_tokens:"]
    lines += [f"  - '{t}'" for t in tokens]
    lines += ["log_names: null", "map_names: null", "num_scenarios_per_type: null", "limit_total_scenarios: null",
              "timestamp_threshold_s: 15", "ego_displacement_minimum_m: null", "ego_start_speed_threshold: null",
              "ego_stop_speed_threshold: null", "speed_noise_tolerance: null", "expand_scenarios: false",
              "remove_invalid_goals: true", "shuffle: false"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokens", type=Path, help="token file, one per line")
    parser.add_argument("out", type=Path, help="YAML to write (<search path root>/scenario_filter/<name>.yaml)")
    args = parser.parse_args(argv)
    try:
        tokens = read_tokens(args.tokens)
    except (OSError, TokenListError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(scenario_filter_yaml(tokens))
    print(f"wrote {args.out} ({len(tokens)} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
