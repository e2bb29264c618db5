#!/usr/bin/env bash
# shapeguard's GPU checks in one go: flash-attn against the SDPA fallback, the traced
# flash-attn entry points and kernel op, the FlashAttention example on the GPU, and that
# no attention reach is read on the GPU (test_reach_gpu.py, which needs no flash-attn).
#
#   tests/gpu/run_gpu_checks.sh            # from anywhere; extra args go to pytest
#   REQUIRE_FLASH=1 tests/gpu/run_gpu_checks.sh   # fail (exit 3) instead of skipping
#
# Needs a CUDA GPU of compute capability 8.0+ and flash-attn (pip install flash-attn).
set -euo pipefail
cd "$(dirname "$0")/../.."

python - <<'PY'
import os
import sys

import torch

print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"GPU: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
try:
    import flash_attn
    print(f"flash-attn {flash_attn.__version__}")
except Exception as error:
    print(f"flash-attn unavailable: {type(error).__name__}: {error}")
    if os.environ.get("REQUIRE_FLASH") == "1":
        sys.exit(3)
PY

status=0
python -m pytest -q -rs -p no:cacheprovider tests/gpu "$@" || status=$?
if [ "$status" -eq 5 ]; then  # pytest: nothing collected, i.e. the module skipped itself
    echo "no GPU check ran: see the skip reason above"
    [ "${REQUIRE_FLASH:-0}" = 1 ] && exit 3
elif [ "$status" -ne 0 ]; then
    exit "$status"
fi
python examples/seed_flash.py
