from glob import glob

from setuptools import find_packages, setup

PACKAGE = "luna_bringup"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.py")),
        (f"share/{PACKAGE}/config", glob("config/*")),
    ],
    # luna_bridge: `luna demo` runs the simulator (a pip package, so not in package.xml).
    install_requires=["luna_core", "luna_msgs_py", "luna_nodes", "luna_bags", "luna_bridge", "pyyaml", "numpy"],
    zip_safe=False,
    maintainer="LUNA-AD team",
    description="Launch, parameters and topology of the LUNA-AD stack; the luna command",
    license="Apache-2.0",
    entry_points={"console_scripts": ["luna = luna_bringup.cli:main"]},
)
