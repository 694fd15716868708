#!/usr/bin/env bash
# The main job: set up, then compile the GPT block sample, print its IR and fusion plan,
# and check the generated kernels against eager PyTorch (on CPU through Triton's interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/minicomp compile samples/gpt_block.py --dump-ir --dump-plan --check "$@"
