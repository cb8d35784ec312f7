"""The ``luna bag`` command group (record, play, info, report, from-scenario); ``luna replay`` (which runs
the stack) is luna_bringup.replay's.

Each subcommand's module defines ``add_arguments(parser)`` (which sets ``func``) and ``run(args)``;
matplotlib and the bridge are imported only when the subcommand that needs them runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _info(args: argparse.Namespace) -> int:
    from luna_bags.reader import BagError, BagReader

    try:
        reader = BagReader(args.bag)
    except BagError as err:
        print(f"luna bag info: {err}", file=sys.stderr)
        return 2
    with reader:
        first, last = reader.time_range()
        print(f"bag:      {reader.path}")
        print(f"messages: {reader.message_count} readable, {(last - first) / 1e9:.3f} s "
              f"from {first / 1e9:.3f} s")
        for name, topic in sorted(reader.topics.items()):
            defined = "definition embedded" if topic.msgdef.data else "no definition"
            print(f"  {name:40s} {topic.msgtype:40s} {topic.count:8d}  ({defined})")
        for issue in reader.issues:
            print(f"issue: {issue}")
    return 1 if reader.issues else 0


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from luna_bags.reader import BagError
    from luna_bags.report import write_report

    bag = Path(args.bag)
    try:
        path = write_report(bag, Path(args.output) if args.output else bag / "report")
    except BagError as err:
        print(f"luna bag report: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}", file=sys.stderr)
    return 0


def register(subparsers, fastdds_profile: Path | None = None) -> None:
    """Add ``bag`` (with its subcommands) to the ``luna`` command; ``fastdds_profile``: the DDS profile
    ``record`` and ``play`` start rclpy with (``ros.init_ros``)."""
    from luna_bags import convert, play, record

    bag = subparsers.add_parser("bag", help="record, play, inspect and make rosbag2 bags")
    bag.set_defaults(fastdds_profile=fastdds_profile)
    sub = bag.add_subparsers(dest="bag_command", required=True)
    p = sub.add_parser("record", help="record live topics (all by default) into a bag",
                       description=record.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    record.add_arguments(p)
    p = sub.add_parser("play", help="publish a bag's messages with their timing and /clock",
                       description=play.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    play.add_arguments(p)
    p = sub.add_parser("info", help="topics, counts and damage of a bag")
    p.add_argument("bag", help="bag directory, or a single .mcap / .db3 file")
    p.set_defaults(func=_info)
    p = sub.add_parser("report", help="write the replay report (HTML, Markdown, PNGs) for a bag of a running stack")
    p.add_argument("bag", help="bag directory, or a single .mcap / .db3 file")
    p.add_argument("-o", "--output", help="report directory (default <bag>/report)")
    p.set_defaults(func=_report)
    p = sub.add_parser("from-scenario", help="write a bridge scenario's stack inputs into a bag",
                       description=convert.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    convert.add_arguments(p)
