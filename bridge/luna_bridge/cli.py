"""``luna-bridge``: the closed-loop bridge (DESIGN Sec. 8)."""

from __future__ import annotations

import argparse
import sys

from luna_bridge import eval_command, reflection_round, ros_command, scenario_commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="luna-bridge", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    eval_command.register(sub)  # each command module registers itself and sets ``func``
    ros_command.register(sub)
    scenario_commands.register(sub)  # generate-suite, scenarios
    reflection_round.register(sub)  # reflect
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
