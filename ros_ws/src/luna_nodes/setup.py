from setuptools import find_packages, setup

PACKAGE = "luna_nodes"

# One executable per node (or composed process); the topology in luna_bringup names these.
EXECUTABLES = {
    "map_server": "luna_nodes.map_server:main",
    "scene_descriptor": "luna_nodes.scene_descriptor:main",
    "progress_monitor": "luna_nodes.progress_monitor:main",
    "planner": "luna_nodes.planner:main",
    "decision_stack": "luna_nodes.decision_stack:main",  # decision_inference + explainer, one model
    "decision_inference": "luna_nodes.decision_inference:main",
    "explainer": "luna_nodes.explainer:main",
    "reflection_client": "luna_nodes.reflection_client:main",
}

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
    ],
    install_requires=["luna_core", "luna_msgs_py", "pyyaml"],
    zip_safe=False,
    maintainer="LUNA-AD team",
    description="Thin rclpy nodes of the LUNA-AD stack",
    license="Apache-2.0",
    entry_points={"console_scripts": [f"{k} = {v}" for k, v in EXECUTABLES.items()]},
)
