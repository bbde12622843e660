#!/usr/bin/env bash
# Create .venv and install fedrec-privacy with its test and benchmark extras.
# torch is pinned to the CPU wheel these machines have on disk (installed first, so no
# resolver step can pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q "torch==2.13.0"
pip install -q -e ".[test,bench]"
python -c "import flwr, torch, tenseal, opacus; print('installed: flwr', flwr.__version__, '| torch', torch.__version__)"
