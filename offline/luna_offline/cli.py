"""``luna-offline``: the offline pipeline (DESIGN Sec. 7)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="luna-offline", description=__doc__)
    subparsers = parser.add_subparsers(dest="cmd", required=True)
    from luna_offline import train_diffusion; train_diffusion.register(subparsers)  # noqa: E702
    from luna_offline import frames; frames.register(subparsers)  # noqa: E702
    from luna_offline import collect; collect.register(subparsers)  # noqa: E702
    from luna_offline import distill, evaluate; distill.register(subparsers); evaluate.register(subparsers)  # noqa: E702,E501
    from luna_offline import baselines; baselines.register(subparsers)  # noqa: E702
    from luna_offline import ensemble; ensemble.register(subparsers)  # noqa: E702
    args = parser.parse_args(argv)
    return int(args.func(args) or 0) if hasattr(args, "func") else 0


if __name__ == "__main__":
    sys.exit(main())
