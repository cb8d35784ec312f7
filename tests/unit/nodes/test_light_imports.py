"""The light nodes import no heavy ML library (issue 17: a crashed node must be back within 2 T_d = 4 s).

torch (~3 s), openai (~1.3 s), transformers and scipy.signal (~1-2 s) are imported lazily, where a path
that needs them runs. A module-level import slipping back in (directly or through a luna_core module)
puts seconds back on every restart of these nodes; each module is imported in a fresh interpreter,
since this test process itself may already hold those libraries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

LIGHT_NODES = ("map_server", "scene_descriptor", "progress_monitor", "reflection_client")
HEAVY = ("torch", "openai", "transformers", "peft", "scipy.signal")


@pytest.mark.parametrize("node", LIGHT_NODES)
def test_light_node_module_imports_no_heavy_library(node: str) -> None:
    code = (f"import json, sys\nimport luna_nodes.{node}\n"
            f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert proc.returncode == 0, f"importing luna_nodes.{node} failed:\n{proc.stderr[-4000:]}"
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [], (f"luna_nodes.{node} imports {loaded} at module level; find the importer with "
                          f"`python -X importtime -c 'import luna_nodes.{node}'` and import it lazily")


def test_geometry_numpy_path_runs_without_torch() -> None:
    """The NumPy path of luna_core.geometry (backend=None on a machine without a GPU device, or
    backend="numpy") computes without importing torch; where a GPU device node exists, backend=None
    may ask torch whether CUDA is usable, so only backend="numpy" is checked there."""
    code = ("import json, sys\nimport numpy as np\nfrom luna_core import geometry as g\n"
            "from luna_core.types import box_corners\n"
            "a = np.asarray(box_corners(0.0, 0.0, 0.0, 4.0, 2.0))[None, None]\n"
            "b = np.asarray(box_corners(1.0, 0.5, 0.3, 4.0, 2.0))[None, None]\n"
            "boxes = np.concatenate([a, b], 0)\n"
            "hits = g.colliding_objects(boxes, backend='numpy').tolist()\n"
            "gpu_node = any(__import__('glob').glob(p) for p in g._GPU_DEVICE_GLOBS)\n"
            "hits_default = None if gpu_node else g.colliding_objects(boxes).tolist()\n"
            "print(json.dumps([hits, hits_default, gpu_node, 'torch' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    hits, hits_default, gpu_node, torch_loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert hits == [1]
    if gpu_node:
        print("a GPU device node exists here: backend=None was not checked (it may import torch)")
    else:
        assert hits_default == [1]
    assert not torch_loaded, "the NumPy path of luna_core.geometry imported torch"
