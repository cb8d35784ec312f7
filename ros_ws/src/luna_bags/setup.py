from setuptools import find_packages, setup

PACKAGE = "luna_bags"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
    ],
    # rclpy and the message packages come from the ROS install (package.xml), not from PyPI.
    install_requires=["luna_core", "luna_msgs_py", "rosbags", "pyyaml", "numpy", "matplotlib", "tqdm", "lz4",
                      'backports.zstd; python_version < "3.14"'],
    # `luna bag from-scenario` reads the bridge's scenarios (a pip package, so not in package.xml).
    extras_require={"scenarios": ["luna_bridge"]},
    zip_safe=False,
    maintainer="LUNA-AD team",
    description="rosbag2 bags of the LUNA-AD stack without rosbag2_py: record, play, read damaged bags, report",
    license="Apache-2.0",
)
