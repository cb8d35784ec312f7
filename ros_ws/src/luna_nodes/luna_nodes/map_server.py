"""map_server: loads the vehicle's map file into ``map/lane_graph`` (transient local, reliable).

Formats (``luna_core.map_files``): the project's lane-graph JSON, CommonRoad XML (commonroad-io) and
Lanelet2 OSM (the ``lanelet2`` package, UTM projection around ``lanelet2_origin``). A map that cannot
be loaded publishes nothing and is reported as an ERROR in diagnostics, naming the file and why.
Setting the parameters at run time loads and publishes the new map; one that cannot be loaded is
refused with the reason, and the old map stays published.
"""

from __future__ import annotations

import luna_msgs.msg as lm

from luna_core.map_files import MAP_FORMATS, MapLoadError, load_map, parse_origin
from luna_msgs_py import convert, qos
from luna_nodes.base import ERROR, LunaNode, run
from luna_nodes.params import NodeInterface, ParamSpec

INTERFACE = NodeInterface(
    name="map_server",
    summary="Loads the HD map (the project's lane-graph JSON, CommonRoad XML or Lanelet2 OSM) once and "
            "publishes it as a lane graph to late joiners.",
    outputs=[("map/lane_graph", "luna_msgs/LaneGraph", "reliable, transient local, depth 1")],
    params=[
        ParamSpec("map_file", str, "", "Path of the map file; empty = publish nothing and report an error.",
                  runtime=True),
        ParamSpec("map_format", str, "auto", "File format; auto picks it from the extension.",
                  choices=("auto",) + MAP_FORMATS, runtime=True),
        ParamSpec("frame_id", str, "map", "Frame of the published lane graph.", runtime=True),
        ParamSpec("lanelet2_origin", str, "", "Lanelet2 maps: 'lat, lon' (degrees) of the local frame's origin "
                  "(UTM projection); empty = the map's first node. Localization must use the same frame.",
                  runtime=True),
    ],
)


class MapServer(LunaNode):
    def __init__(self) -> None:
        super().__init__(INTERFACE)
        self.publisher = self.luna_publisher(lm.LaneGraph, "map/lane_graph", qos.LATCHED)
        try:
            self.load_and_publish(self.params)
        except MapLoadError as exc:
            self.diagnostics.set_condition("map", ERROR, str(exc))

    def apply_parameters(self, params: dict) -> None:
        try:
            self.load_and_publish(params)
        except MapLoadError as exc:
            raise ValueError(f"map not changed: {exc}") from None

    def load_and_publish(self, params: dict) -> None:
        """Load the map ``params`` name and publish it; MapLoadError (nothing published) if it cannot."""
        path = params["map_file"]
        graph = load_map(path, params["map_format"], parse_origin(params["lanelet2_origin"]))
        graph.frame_id = params["frame_id"]
        graph.stamp = self.now_s()
        self.publisher.publish(convert.lane_graph_to_msg(graph))
        self.diagnostics.clear("map")
        self.diagnostics.set_value("lanes", len(graph.lanes))
        self.diagnostics.set_value("map_file", path)
        self.get_logger().info(f"published lane graph with {len(graph.lanes)} lanes from {path}")


def main(args=None) -> int:
    return run([MapServer], args)


if __name__ == "__main__":
    raise SystemExit(main())
