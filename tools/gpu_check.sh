#!/usr/bin/env bash
# The GPU checks of every issue, as one script (`make gpu-check`): CUDA and NCCL tests, then
# the profiles the model issue asks for (GPT-2 small and one Llama-3-8B-shaped block in bf16),
# one Llama-3-70B-shaped block (the planner's worked example, measured instead of derived), the
# compute model's derived times against it, and the example re-priced on it; written to $OUT
# (the device tool's output folder) or data/. Runs with whatever python is
# given (PY=...); on a machine without hydra-core/omegaconf/wandb, `make gpu-wheels` here
# first and carry .whl/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DEST=${OUT:-data}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
echo "== environment"
"$PY" - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PY
echo "== tests (-m gpu): pp=1 over NCCL; every schedule at pp=2 (one GPU: shared, via host; more: NCCL safe)"
"$PY" -m pytest -q -s -m gpu -p no:cacheprovider tests/test_gpu.py
status=$?
echo "== profile: GPT-2 small, bf16"
"$PY" -m harness.profile model=gpt2_small device=cuda dtype=bf16 --microbatch-sizes 1 4 8 \
  --out "$DEST/gpt2_small_bf16_profile.json" || status=1
echo "== profile: one Llama-3-8B-shaped block (and embedding, head), bf16, expanded to 32 blocks"
"$PY" -m harness.profile model=hf model.arch=llama model.layers=32 model.hidden=4096 model.heads=32 \
  model.kv_heads=8 model.ffn=14336 model.vocab=128256 model.seq=4096 device=cuda dtype=bf16 \
  --blocks 1 --microbatch-sizes 1 2 4 --out "$DEST/llama3_8b_block_bf16_profile.json" || status=1
echo "== profile: one Llama-3-70B-shaped block (and embedding, head), bf16, expanded to 80 blocks"
"$PY" -m harness.profile model=hf model.arch=llama model.layers=80 model.hidden=8192 model.heads=64 \
  model.kv_heads=8 model.ffn=28672 model.vocab=128256 model.seq=4096 device=cuda dtype=bf16 \
  --blocks 1 --microbatch-sizes 1 2 4 --out "$DEST/llama70b_h200_block_profile.json" || status=1
if [ -f "$DEST/llama70b_h200_block_profile.json" ]; then
  echo "== the derived 70B profile (compute model) against the measured one"
  "$PY" -m harness.advise.derive --compare "$DEST/llama70b_h200_block_profile.json" || status=1
  echo "== the README's 70B example re-priced on the measured block"
  "$PY" -m harness.advise cluster=h200_8nodes profile="$DEST/llama70b_h200_block_profile.json" dtype=bf16 \
    optimizer=adamw --global-batch 512 --out "$DEST/advise_measured" || status=1
fi
echo "== gpu-check: exit $status"
exit $status
