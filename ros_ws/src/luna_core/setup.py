from setuptools import find_packages, setup

PACKAGE = "luna_core"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    package_data={PACKAGE: ["prompts/*.txt", "py.typed"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
    ],
    install_requires=["numpy"],
    zip_safe=False,
    maintainer="LUNA-AD team",
    description="LUNA-AD algorithms in pure Python",
    license="Apache-2.0",
)
