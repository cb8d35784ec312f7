"""Combine saved students that share their base and adapter into one whose head is an ensemble of theirs.

    from luna_core.student.ensemble import save_head_ensemble
    save_head_ensemble(["models/student", "benchmarks/data/student_s39_timing/egot"], "out/ensemble")

The members must see the same h_{i*}: the same base model (hash) and the same adapter file (checksum), as
every head trained by ``luna-offline distill --stage head`` on one cache does. The result is a saved student
like any other (``DualHeadStudent.from_pretrained``): its config lists the members' scene parts
(``StudentConfig.head_members``), its head file holds each member's weights under ``members.<i>.``, in the
order given, and the decision costs one forward pass of the base as before.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

from luna_core.student import files
from luna_core.student.config import StudentConfig
from luna_core.student.errors import StudentModelFileError


def save_head_ensemble(members: Sequence[str | Path], out: str | Path) -> Path:
    """Write the student whose decision head is the ensemble of ``members``' heads to ``out`` (atomically);
    ``StudentModelFileError`` naming the member that does not fit."""
    from safetensors.torch import save_file

    from luna_core.student.model import decision_head, load_decision_head

    members = [Path(m) for m in members]
    if len(members) < 2:
        raise StudentModelFileError(f"an ensemble needs at least 2 students, got {len(members)}")
    configs, metas, heads = [], [], {}
    for i, folder in enumerate(members):
        config = StudentConfig.load(folder / files.CONFIG_FILE)
        meta = files.read_meta(folder)
        if config.head_members:
            raise StudentModelFileError(f"{folder}: already an ensemble of heads; list its members instead")
        first_config, first_meta = (configs or [config])[0], (metas or [meta])[0]
        for what, mine, theirs in (
                ("base model hash", meta["base_model_hash"], first_meta["base_model_hash"]),
                ("adapter", meta["files"].get(files.ADAPTER_FILE), first_meta["files"].get(files.ADAPTER_FILE)),
                ("d_model", meta.get("d_model"), first_meta.get("d_model")),
                ("head_hidden", config.head_hidden, first_config.head_hidden)):
            if mine != theirs:
                raise StudentModelFileError(f"{folder}: its {what} differs from {members[0]}'s ({mine!r} against "
                                            f"{theirs!r}); the heads of an ensemble must read the same h_i*")
        state = load_decision_head(folder).state_dict()
        heads.update({f"members.{i}.{k}": v.contiguous() for k, v in state.items()})
        configs.append(config)
        metas.append(meta)
    dims = [c.head_scene_dim for c in configs]
    config = StudentConfig.from_dict({**configs[0].to_dict(), "head_members": dims,
                                      "head_scene_dim": StudentConfig.ensemble_scene_dim(dims)})
    try:
        decision_head(config, int(metas[0]["d_model"])).load_state_dict(heads, strict=True)
    except RuntimeError as exc:
        names = [str(m) for m in members]
        raise StudentModelFileError(f"the heads of {names} do not form an ensemble ({exc})") from exc
    # A head saved alone (benchmarks/data/student_*) names its adapter by checksum without the file.
    holders = [(m, meta) for m, meta in zip(members, metas) if (m / files.ADAPTER_FILE).is_file()]
    if not holders:
        checksum = metas[0]["files"][files.ADAPTER_FILE][:16]
        raise StudentModelFileError(f"none of {[str(m) for m in members]} holds {files.ADAPTER_FILE}: put the "
                                    f"adapter they were trained on (checksum {checksum}...) beside one of them")
    adapter = files.check_file(holders[0][0], files.ADAPTER_FILE, holders[0][1])
    tmp = files.staging_dir(Path(out))
    shutil.copyfile(adapter, tmp / files.ADAPTER_FILE)
    save_file(heads, str(tmp / files.HEAD_FILE))
    config.save(tmp / files.CONFIG_FILE)
    files.write_meta(tmp, metas[0]["base_model_hash"], config.base_model, int(metas[0]["d_model"]))
    return files.replace_dir(tmp, Path(out))
