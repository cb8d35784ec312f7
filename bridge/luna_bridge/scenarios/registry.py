"""Named scenario suites: ``synthetic-hard``, ``synthetic-random``, ``synthetic-train`` (the bundled
files) and ``commonroad`` (the recorded NGSIM scenarios beside the repository).

``suite_refs(name)`` lists what a suite holds without loading it (the evaluator loads each
scenario in its worker); ``load_suite(name)`` loads everything and returns the scenarios together
with every file that failed to load and why: nothing is dropped silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from luna_bridge.scenario import Scenario

DATA_DIR = Path(__file__).parent / "data"
SYNTHETIC_SUITES = {"synthetic-hard": "hard", "synthetic-random": "random", "synthetic-train": "train"}
SUITES = (*SYNTHETIC_SUITES, "commonroad")
FILE_LOADER = "luna_bridge.scenarios.format:load_scenario"
COMMONROAD_LOADER = "luna_bridge.scenarios.commonroad:load_commonroad"


def commonroad_dir() -> Path:
    """``$LUNA_COMMONROAD_DIR``, else ``../shared/scenarios/commonroad`` beside the repository."""
    env = os.environ.get("LUNA_COMMONROAD_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    return repo.parent / "shared" / "scenarios" / "commonroad"


@dataclass(frozen=True)
class SuiteEntry:
    """One scenario of a suite: ``loader`` ("module:function") applied to ``source`` loads it."""

    name: str
    source: str
    loader: str


@dataclass
class LoadFailure:
    source: str
    error: str


@dataclass
class SuiteLoad:
    scenarios: list[Scenario] = field(default_factory=list)
    failures: list[LoadFailure] = field(default_factory=list)


def _scenario_name(path: Path) -> str:
    return path.name.split(".json")[0] if ".json" in path.name else path.stem


def suite_refs(name: str) -> list[tuple[str, str, str]]:
    """(name, source, loader) of every scenario in suite ``name`` (a suite name or a directory),
    sorted by name. Raises KeyError for an unknown suite, FileNotFoundError for a missing folder."""
    if name in SYNTHETIC_SUITES:
        folder = DATA_DIR / SYNTHETIC_SUITES[name]
    elif name == "commonroad":
        folder = commonroad_dir()
    elif Path(name).is_dir():
        folder = Path(name)
    else:
        raise KeyError(f"unknown suite {name!r}; known: {', '.join(SUITES)} or a directory of scenario files")
    if not folder.is_dir():
        hint = " (set LUNA_COMMONROAD_DIR)" if name == "commonroad" else \
            " (run `luna-bridge generate-suite`)" if name in SYNTHETIC_SUITES else ""
        raise FileNotFoundError(f"suite {name!r}: folder {folder} does not exist{hint}")
    refs = []
    for p in sorted(folder.iterdir()):
        if p.name.endswith((".json", ".json.gz")):
            refs.append((_scenario_name(p), str(p), FILE_LOADER))
        elif p.suffix == ".xml":
            refs.append((p.stem, str(p), COMMONROAD_LOADER))
    return refs


def load_entry(source: str, loader: str) -> Scenario:
    import importlib

    module, attr = loader.split(":", 1)
    return getattr(importlib.import_module(module), attr)(source)


def load_suite(name: str) -> SuiteLoad:
    """All scenarios of suite ``name``, and every load failure with its error message."""
    out = SuiteLoad()
    for _, source, loader in suite_refs(name):
        try:
            out.scenarios.append(load_entry(source, loader))
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none dropped
            out.failures.append(LoadFailure(source, f"{type(exc).__name__}: {exc}"))
    return out
