"""Keep docs/nodes/<node>.md true: their interface tables are generated from each node's INTERFACE.

    python -m luna_nodes.docs docs/nodes          # rewrite the generated blocks
    python -m luna_nodes.docs docs/nodes --check  # exit 1 if any page is out of date (used by the tests)

A page holds free text (behaviour, degraded modes, examples) plus one generated block between the
BEGIN/END markers; a missing page is created with a stub heading.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from luna_nodes.params import NodeInterface, markdown_table

#: Every node of the stack, by name -> module defining INTERFACE.
NODE_MODULES = {
    "map_server": "luna_nodes.map_server",
    "scene_descriptor": "luna_nodes.scene_descriptor",
    "progress_monitor": "luna_nodes.progress_monitor",
    "planner": "luna_nodes.planner",
    "decision_inference": "luna_nodes.decision_inference:DECISION_INTERFACE",
    "explainer": "luna_nodes.explainer:EXPLAINER_INTERFACE",
    "reflection_client": "luna_nodes.reflection_client",
}

BEGIN = "<!-- BEGIN GENERATED: interface (python -m luna_nodes.docs docs/nodes) -->"
END = "<!-- END GENERATED -->"


def interface_markdown(iface: NodeInterface) -> str:
    def topics(rows: list[tuple[str, str, str]]) -> str:
        if not rows:
            return "_none_"
        lines = ["| topic | type | QoS / notes |", "|---|---|---|"]
        lines += [f"| `{t}` | `{ty}` | {note} |" for t, ty, note in rows]
        return "\n".join(lines)

    return "\n".join([BEGIN, "", "### Inputs", "", topics(iface.inputs), "", "### Outputs", "",
                      topics(iface.outputs + [("/diagnostics", "diagnostic_msgs/DiagnosticArray",
                                                 "reliable, 1 Hz; with `pid` and `process_cpu_s` (the "
                                                 "process's CPU seconds)")]),
                      "", "### Parameters", "", markdown_table(iface.params) if iface.params else "_none_",
                      "", END])


def render_page(existing: str | None, iface: NodeInterface) -> str:
    block = interface_markdown(iface)
    if existing and BEGIN in existing and END in existing:
        head, rest = existing.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        return head + block + tail
    return f"# {iface.name}\n\n{iface.summary}\n\n## Interface\n\n{block}\n"


INTERFACES_INTRO = """# Interfaces (`luna_msgs`)

Generated from `ros_ws/src/luna_msgs/msg/*.msg` by `python -m luna_nodes.docs docs/nodes`; the field
comments are the documentation. Conventions: SI units, radians, REP-103 axes; poses of the ego at the
rear axle, of objects at the box centre; headers carry the node-clock stamp and the `map` frame.
Topics and QoS per node: [nodes/](nodes/). Standard types used alongside: `nav_msgs/Odometry`
(`localization/kinematic_state`), `std_msgs/UInt64` (`luna/memory/version`),
`visualization_msgs/MarkerArray` (`planning/debug/candidates`), `diagnostic_msgs/DiagnosticArray`.
"""


def interfaces_markdown(msg_dir: Path) -> str:
    parts = [INTERFACES_INTRO]
    for f in sorted(msg_dir.glob("*.msg")):
        parts.append(f"## {f.stem}\n\n```\n{f.read_text().rstrip()}\n```\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m luna_nodes.docs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    stale = []
    for name, module in NODE_MODULES.items():
        module, _, attr = module.partition(":")
        iface = getattr(importlib.import_module(module), attr or "INTERFACE")
        page = args.directory / f"{name}.md"
        existing = page.read_text() if page.exists() else None
        new = render_page(existing, iface)
        if new != existing:
            stale.append(str(page))
            if not args.check:
                page.parent.mkdir(parents=True, exist_ok=True)
                page.write_text(new)
    interfaces = args.directory.parent / "interfaces.md"
    msg_dir = Path(__file__).resolve().parents[2] / "luna_msgs" / "msg"
    if msg_dir.is_dir():
        text = interfaces_markdown(msg_dir)
        if not interfaces.exists() or interfaces.read_text() != text:
            stale.append(str(interfaces))
            if not args.check:
                interfaces.write_text(text)
    if stale:
        print(("out of date: " if args.check else "updated: ") + ", ".join(stale))
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
