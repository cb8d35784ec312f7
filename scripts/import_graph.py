#!/usr/bin/env python3
"""The import graph between the project's Python packages, read from the sources with ast.

    python scripts/import_graph.py            # the cross-package edge table (markdown)
    python scripts/import_graph.py --third    # the third-party modules each package imports
    python scripts/import_graph.py --png docs/figures/packages.png   # and the graph as a picture

No package is imported: the table describes what the code says, so it runs without the venv and
without ROS. tests/unit/test_dependencies.py uses the same functions to check the star and the
declared dependencies, so the table in docs/architecture.md and the test cannot disagree.
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Package:
    """One of our Python distributions: where its sources lie and the module names it provides."""

    name: str  # distribution / ROS package name
    root: Path  # the folder holding setup.py or pyproject.toml
    modules: tuple[str, ...]  # top-level import names it provides

    def sources(self) -> list[Path]:
        """Every .py file the package ships (its modules and, for ROS packages, its launch files);
        setup.py is the build script, not the package."""
        files: list[Path] = []
        for module in self.modules:
            files += sorted((self.root / module).rglob("*.py"))
        files += sorted((self.root / "launch").glob("*.py"))
        return files


def project_packages(root: Path = ROOT) -> list[Package]:
    """Our Python packages: each ros_ws/src/<pkg>/<pkg> with a setup.py, plus bridge/ and offline/."""
    packages: list[Package] = []
    for setup in sorted((root / "ros_ws" / "src").glob("*/setup.py")):
        pkg = setup.parent
        packages.append(Package(pkg.name, pkg, (pkg.name,)))
    for folder, dist in (("bridge", "luna_bridge"), ("offline", "luna_offline")):
        packages.append(Package(dist, root / folder, (dist,)))
    return packages


@dataclass(frozen=True)
class Import:
    """One absolute import statement's top-level module and where it is."""

    module: str  # top-level name (``luna_nodes`` for ``from luna_msgs_py.convert import x``)
    full: str  # the dotted name as written
    path: Path
    line: int
    deferred: bool  # inside a function (imported only when called), under TYPE_CHECKING or try/except ImportError


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _guards_import_error(node: ast.Try) -> bool:
    """A try whose handlers catch ImportError (or a parent of it): the import in it is optional."""
    for handler in node.handlers:
        names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for name in names:
            if name is None or (isinstance(name, ast.Name) and name.id in ("ImportError", "ModuleNotFoundError", "Exception")):
                return True
    return False


def imports_of(path: Path) -> list[Import]:
    """The absolute imports of one file (relative imports stay inside the package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Import] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.If) and _is_type_checking(child):
                inner = True
            if isinstance(child, ast.Try) and _guards_import_error(child):
                inner = True
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(alias.name.split(".")[0], alias.name, path, child.lineno, deferred))
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append(Import(child.module.split(".")[0], child.module, path, child.lineno, deferred))
            visit(child, inner)

    visit(tree, False)
    return found


@dataclass
class Graph:
    """Cross-package edges (importer -> imported -> the imports) and third-party imports per package."""

    edges: dict[tuple[str, str], list[Import]] = field(default_factory=lambda: defaultdict(list))
    third_party: dict[str, dict[str, list[Import]]] = field(default_factory=dict)


def build_graph(packages: list[Package] | None = None, ros_interfaces: frozenset[str] = frozenset()) -> Graph:
    """``ros_interfaces``: names of message packages (luna_msgs and the ROS ones) that are not
    Python distributions of ours but are still counted as third party."""
    packages = packages if packages is not None else project_packages()
    owner = {module: pkg.name for pkg in packages for module in pkg.modules}
    stdlib = set(sys.stdlib_module_names)
    graph = Graph()
    for pkg in packages:
        third: dict[str, list[Import]] = defaultdict(list)
        for path in pkg.sources():
            for imp in imports_of(path):
                target = owner.get(imp.module)
                if target == pkg.name or imp.module in stdlib or imp.module == "__future__":
                    continue
                if target is not None:
                    graph.edges[(pkg.name, target)].append(imp)
                else:
                    third[imp.module].append(imp)
        graph.third_party[pkg.name] = dict(third)
    return graph


def edge_table(graph: Graph, root: Path = ROOT) -> str:
    """Markdown: importer, imported, files, the modules imported, how many are deferred."""
    rows = ["| importer | imports | files | modules | deferred imports |", "|---|---|---|---|---|"]
    for (src, dst), imps in sorted(graph.edges.items()):
        files = {imp.path for imp in imps}
        modules = sorted({imp.full for imp in imps})
        deferred = sum(imp.deferred for imp in imps)
        rows.append(f"| {src} | {dst} | {len(files)} | {', '.join(f'`{m}`' for m in modules)} | {deferred}/{len(imps)} |")
    return "\n".join(rows)


#: Where each package is drawn (luna_core in the middle; composition on top). Packages not named here
#: are placed on a ring, so a new package still shows up.
_LAYOUT = {"luna_core": (0.0, 0.0), "luna_msgs_py": (-1.5, 1.2), "luna_bridge": (1.5, 1.2),
           "luna_nodes": (-2.9, 1.5), "luna_bags": (0.0, 3.2), "luna_offline": (2.4, 2.8),
           "luna_bringup": (-1.5, 4.0)}


def draw(graph: Graph, packages: list[Package], path: Path) -> None:
    """The package graph as a PNG: one arrow per cross-package edge, labelled with its file count."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [p.name for p in packages]
    pos = dict(_LAYOUT)
    extra = [n for n in names if n not in pos]
    for i, name in enumerate(extra):
        pos[name] = (3.0 * math.cos(2 * math.pi * i / len(extra)), 3.0 * math.sin(2 * math.pi * i / len(extra)))
    fig, ax = plt.subplots(figsize=(8, 7))
    boxes = {}
    for name in names:  # boxes first: the arrows are clipped at them
        x, y = pos[name]
        boxes[name] = ax.text(x, y, name, ha="center", va="center", fontsize=11, zorder=3, bbox=dict(
            boxstyle="round,pad=0.4", fc="#dfe9f5" if name == "luna_core" else "#f2f2f2", ec="#333"))
    fig.canvas.draw()  # lay the boxes out so the arrows can be clipped at them
    for (src, dst), imps in sorted(graph.edges.items()):
        (x0, y0), (x1, y1) = pos[src], pos[dst]
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=1,
                    arrowprops=dict(arrowstyle="-|>", color="#555", lw=1.2, shrinkA=3, shrinkB=3,
                                    patchA=boxes[src].get_bbox_patch(), patchB=boxes[dst].get_bbox_patch(),
                                    connectionstyle="arc3,rad=0.06"))
        ax.text(0.6 * x0 + 0.4 * x1, 0.6 * y0 + 0.4 * y1, str(len({i.path for i in imps})), fontsize=8, zorder=2,
                color="#333", ha="center", va="center", bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none"))
    ax.set_xlim(-3.7, 3.3)
    ax.set_ylim(-0.4, 4.4)
    ax.set_axis_off()
    ax.set_title("Imports between the project's packages (arrow: importer -> imported; number: files)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--third", action="store_true", help="list third-party imports per package")
    parser.add_argument("--files", action="store_true", help="list the files behind each edge")
    parser.add_argument("--png", type=Path, help="also draw the package graph into this PNG")
    args = parser.parse_args()
    graph = build_graph()
    if args.png:
        draw(graph, project_packages(), args.png)
    print(edge_table(graph))
    if args.files:
        for (src, dst), imps in sorted(graph.edges.items()):
            print(f"\n{src} -> {dst}")
            for imp in imps:
                print(f"  {imp.path.relative_to(ROOT)}:{imp.line} {imp.full}{' (deferred)' if imp.deferred else ''}")
    if args.third:
        for name, third in graph.third_party.items():
            mods = ", ".join(f"{m}{'' if any(not i.deferred for i in v) else '*'}" for m, v in sorted(third.items()))
            print(f"\n{name}: {mods}")


if __name__ == "__main__":
    main()
