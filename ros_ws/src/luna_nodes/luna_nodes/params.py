"""Typed parameter declaration with validation at start-up and at run time.

Each node lists its parameters as ``ParamSpec``s (name, type, default, unit, range, description), in
the spirit of Autoware's parameter schemas. ``declare_parameters`` declares them, checks every value
(type, range, choices) and raises ``ParameterError`` naming the parameter, the node and the
parameter file(s), so the node exits non-zero with a clear message instead of running misconfigured.
``check_runtime_change`` applies the same checks to a ``set_parameters`` request on a running node
(``luna_nodes.base`` answers it): a parameter marked ``runtime`` is applied at once, any other only
while a managed node is unconfigured (its next configure reads it). The same specs render the
parameter table of ``docs/nodes/<node>.md``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from rcl_interfaces.msg import ParameterDescriptor

from luna_core.types import VehicleParameters

_TYPE_NAMES = {bool: "bool", int: "int", float: "double", str: "string"}


class ParameterError(ValueError):
    """A parameter value is missing, of the wrong type, or out of range."""


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: type  # bool, int, float, str, or list (a list of ``item_type``)
    default: Any
    description: str
    unit: str = ""
    min: float | None = None
    max: float | None = None
    choices: tuple = ()
    item_type: type = str  # for lists
    runtime: bool = False  # the node applies a new value while it runs (else: read at start-up / configure)

    @property
    def type_name(self) -> str:
        if self.type is list:
            return f"{_TYPE_NAMES[self.item_type]}[]"
        return _TYPE_NAMES[self.type]


_VEHICLE = VehicleParameters()
#: The ego's geometry (``luna_core.types.VehicleParameters``, relative to the rear axle; Autoware's
#: vehicle_info in spirit), declared by every node that needs the ego's box and set once for all of them
#: in config/common.param.yaml. Defaults: nuPlan's Chrysler Pacifica, which the simulator runs.
VEHICLE_PARAMS = (
    ParamSpec("vehicle_width", float, _VEHICLE.width, "Ego width.", "m", min=0.5, max=5.0),
    ParamSpec("vehicle_front_length", float, _VEHICLE.front_length, "Rear axle to front bumper.", "m",
              min=0.1, max=20.0),
    ParamSpec("vehicle_rear_length", float, _VEHICLE.rear_length, "Rear axle to rear bumper.", "m",
              min=0.0, max=10.0),
    ParamSpec("vehicle_wheelbase", float, _VEHICLE.wheelbase, "Wheelbase (the tracker's bicycle model).", "m",
              min=0.5, max=10.0),
    ParamSpec("vehicle_cog_from_rear_axle", float, _VEHICLE.cog_position_from_rear_axle,
              "Rear axle to centre of gravity (the tracker's bicycle model).", "m", min=0.0, max=10.0),
)


def vehicle_parameters(params: dict) -> VehicleParameters:
    """The ego geometry of a node's ``VEHICLE_PARAMS`` values."""
    return VehicleParameters(width=params["vehicle_width"], front_length=params["vehicle_front_length"],
                             rear_length=params["vehicle_rear_length"], wheelbase=params["vehicle_wheelbase"],
                             cog_position_from_rear_axle=params["vehicle_cog_from_rear_axle"])


def params_files(argv: Sequence[str] | None = None) -> list[str]:
    """The ``--params-file`` arguments of this process (for error messages)."""
    argv = list(sys.argv if argv is None else argv)
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--params-file"]


def parameters_from_args(argv: Sequence[str], node_name: str, specs: Sequence[ParamSpec]) -> dict[str, Any]:
    """The values ``specs`` would take on node ``node_name`` started with ``argv``, read without rclpy:
    the defaults, then each ``--params-file`` in order (its ``/**`` section, then the node's), then the
    ``-p name:=value`` overrides, validated as at start-up. A standby process (``luna_nodes.base.run``)
    preloads its models with them before it joins the ROS graph. ``use_sim_time`` is included."""
    import yaml

    args = list(argv)
    raw: dict[str, Any] = {}
    for i, arg in enumerate(args[:-1]):
        if arg == "--params-file":
            with open(args[i + 1], encoding="utf-8") as f:
                data = yaml.safe_load(f) or {}
            for section in ("/**", node_name, "/" + node_name):
                raw.update((data.get(section) or {}).get("ros__parameters") or {})
        elif arg in ("-p", "--param") and ":=" in args[i + 1]:
            name, value = args[i + 1].split(":=", 1)
            raw[name] = yaml.safe_load(value)
    values = {spec.name: validate(spec, raw.get(spec.name, spec.default)) for spec in specs}
    values["use_sim_time"] = bool(raw.get("use_sim_time", False))
    return values


def _coerce(spec: ParamSpec, value: Any) -> Any:
    """Return the value converted to the spec's type, or raise TypeError saying what was found."""
    def one(v: Any, t: type) -> Any:
        if t is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)  # YAML `1` for a double is a common, harmless slip
        if t is bool and not isinstance(v, bool):
            raise TypeError
        if t is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise TypeError
        if t in (float, str) and not isinstance(v, t):
            raise TypeError
        return v

    try:
        if spec.type is list:
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise TypeError
            return [one(v, spec.item_type) for v in value]
        return one(value, spec.type)
    except TypeError:
        found = type(value).__name__
        raise TypeError(f"expected {spec.type_name}, got {found} {value!r}") from None


def validate(spec: ParamSpec, value: Any) -> Any:
    """Check one value against its spec; raises ParameterError (without node context)."""
    try:
        v = _coerce(spec, value)
    except TypeError as exc:
        raise ParameterError(f"parameter '{spec.name}': {exc}") from None
    items = v if isinstance(v, list) else [v]
    for item in items:
        if isinstance(item, float) and not math.isfinite(item):
            raise ParameterError(f"parameter '{spec.name}': value {item} is not finite")
        if spec.min is not None and item < spec.min:
            raise ParameterError(f"parameter '{spec.name}': value {item} is below the minimum {spec.min}")
        if spec.max is not None and item > spec.max:
            raise ParameterError(f"parameter '{spec.name}': value {item} is above the maximum {spec.max}")
        if spec.choices and item not in spec.choices:
            raise ParameterError(f"parameter '{spec.name}': value {item!r} is not one of {list(spec.choices)}")
    return v


def check_runtime_change(specs: Sequence[ParamSpec], changes: dict[str, Any], node_name: str,
                         start_up_open: bool) -> dict[str, Any]:
    """Validate a run-time change (name -> new value) against ``specs``; the values to apply, converted.

    Raises ParameterError with the reason the change is refused: a value the start-up check would
    refuse, or a parameter that is read only at start-up while that is no longer open (a managed node
    past configure: ``start_up_open`` False). Names without a spec (rclpy's own, e.g. use_sim_time)
    are not checked here and not returned.
    """
    by_name = {s.name: s for s in specs}
    values: dict[str, Any] = {}
    for name, value in changes.items():
        spec = by_name.get(name)
        if spec is None:
            continue
        try:
            values[name] = validate(spec, value)
        except ParameterError as exc:
            raise ParameterError(f"node '{node_name}': {exc}") from None
        if not spec.runtime and not start_up_open:
            raise ParameterError(f"parameter '{name}' of node '{node_name}' is read at start-up only: set it in "
                                 "the parameter file and restart the node (managed nodes: or deactivate and "
                                 "clean up, set it, configure again)")
    return values


def declare_parameters(node, specs: Sequence[ParamSpec]) -> dict[str, Any]:
    """Declare ``specs`` on an rclpy node and return their validated values by name."""
    values: dict[str, Any] = {}
    for spec in specs:
        descriptor = ParameterDescriptor(description=f"{spec.description} [{spec.unit}]" if spec.unit
                                         else spec.description, dynamic_typing=True)
        try:
            param = node.declare_parameter(spec.name, spec.default, descriptor)
            values[spec.name] = validate(spec, param.value)
        except ParameterError as exc:
            files = ", ".join(params_files()) or "no parameter file"
            raise ParameterError(f"node '{node.get_name()}' ({files}): {exc}") from None
    return values


def markdown_table(specs: Sequence[ParamSpec]) -> str:
    """The parameter table for docs/nodes/<node>.md."""
    rows = ["| name | type | default | unit | range | at run time | description |", "|---|---|---|---|---|---|---|"]
    for s in specs:
        rng = ""
        if s.min is not None or s.max is not None:
            rng = f"[{'' if s.min is None else s.min}, {'' if s.max is None else s.max}]"
        if s.choices:
            rng = " / ".join(str(c) for c in s.choices)
        when = "applied" if s.runtime else "start-up only"
        rows.append(f"| `{s.name}` | {s.type_name} | `{s.default!r}` | {s.unit} | {rng} | {when} | {s.description} |")
    return "\n".join(rows)


@dataclass
class NodeInterface:
    """A node's documented interface: the source of the inputs/outputs tables in its docs page."""

    name: str
    summary: str
    inputs: list[tuple[str, str, str]] = field(default_factory=list)  # (topic, type, QoS / note)
    outputs: list[tuple[str, str, str]] = field(default_factory=list)
    params: Sequence[ParamSpec] = ()
