from setuptools import find_packages, setup

PACKAGE = "luna_msgs_py"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
    ],
    # rclpy and the message packages come from the ROS install (package.xml), not from PyPI.
    install_requires=["luna_core", "numpy"],
    zip_safe=False,
    maintainer="LUNA-AD team",
    description="Conversions between luna_core types and luna_msgs, and the QoS of each interface",
    license="Apache-2.0",
)
