"""The stack's topic names as bags see them (DESIGN Sec. 5): inputs a field bag provides, outputs the
stack adds. ``luna replay`` plays the inputs and leaves recorded outputs out; the report reads both."""

# Inputs
CLOCK = "/clock"
ODOMETRY = "/localization/kinematic_state"
OBJECTS = "/perception/objects"
TRAFFIC_LIGHTS = "/perception/traffic_lights"
ROUTE = "/planning/route"
LANE_GRAPH = "/map/lane_graph"
INPUT_TOPICS = (CLOCK, ODOMETRY, OBJECTS, TRAFFIC_LIGHTS, ROUTE, LANE_GRAPH)

# Outputs
SCENE = "/luna/scene"
DECISION = "/luna/decision"
FAILURE = "/luna/failure"
EXPLANATION = "/luna/explanation"
REFLECTION = "/luna/reflection"
MEMORY_VERSION = "/luna/memory/version"
TRAJECTORY = "/planning/trajectory"
CANDIDATES = "/planning/debug/candidates"
DIAGNOSTICS = "/diagnostics"
OUTPUT_TOPICS = (SCENE, DECISION, FAILURE, EXPLANATION, REFLECTION, MEMORY_VERSION, TRAJECTORY, CANDIDATES,
                 DIAGNOSTICS)

#: ROS bookkeeping topics: recorded like anything else, never replayed into a live stack.
INFRASTRUCTURE = ("/rosout", "/parameter_events")


def is_replay_input(topic: str) -> bool:
    """Whether ``luna replay`` plays ``topic`` by default: not a stack output, not ROS bookkeeping."""
    return topic not in OUTPUT_TOPICS and topic not in INFRASTRUCTURE and not topic.endswith("/transition_event")
