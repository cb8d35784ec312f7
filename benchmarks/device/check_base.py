"""Device side of stage2_distill.sh: the dequantised base there must hold the same tensor values as here.

``python check_base.py BASE_TENSORS_JSON OUT``. Another transformers version may write the converted
folder differently; ``base_model_hash`` ignores config.json's version stamp (since session 17), but if
the hash still differs while every weight is equal, the --init student's meta is pointed at the
device's hash and ``OUT/base_hash_patch.json`` records both, so the distilled student's meta can be set
back to this machine's hash (docs/student.md, "Stage 2 on an H100"); differing values stop the run.
Write BASE_TENSORS_JSON here with ``python check_base.py --write BASE_TENSORS_JSON``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from safetensors import safe_open

from luna_core import model_cache
from luna_core.student import files


def tensor_hashes(folder: Path) -> dict[str, list]:
    out = {}
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for name in sorted(f.keys()):
            t = f.get_tensor(name).contiguous()
            out[name] = [str(t.dtype), list(t.shape), hashlib.sha256(t.numpy().tobytes()).hexdigest()]
    return out


def main(argv: list[str]) -> int:
    folder = model_cache.resolve("smollm2-135m-instruct")
    if argv[0] == "--write":
        Path(argv[1]).write_text(json.dumps(tensor_hashes(folder), indent=0))
        return 0
    want, got = json.loads(Path(argv[0]).read_text()), tensor_hashes(folder)
    bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    print(f"[check_base] {len(got)} tensors, {len(bad)} differ {bad[:5]}", flush=True)
    if bad:
        return 5
    meta_path = Path("models/student/student_meta.json")
    meta = json.loads(meta_path.read_text())
    here = files.base_model_hash(folder)
    print(f"[check_base] base hash here {here[:16]}, student meta {meta['base_model_hash'][:16]}", flush=True)
    if here != meta["base_model_hash"]:
        Path(argv[1], "base_hash_patch.json").write_text(json.dumps({"local": meta["base_model_hash"], "device": here}))
        meta["base_model_hash"] = here
        meta_path.write_text(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
