#!/usr/bin/env bash
# The GPU checks of every issue, as one script (`make gpu-check`): CUDA and NCCL tests, then
# the figures a closing note needs. Runs with whatever python is given (PY=...); on a
# machine without hydra-core/omegaconf/wandb, `make gpu-wheels` here first and carry .whl/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
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
echo "== tests (-m gpu)"
"$PY" -m pytest -q -s -m gpu -p no:cacheprovider tests/test_gpu.py
status=$?
echo "== gpu-check: pytest exit $status"
exit $status
