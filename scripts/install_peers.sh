#!/usr/bin/env bash
# PyTorch (and transformers) for scripts/peers.py: an optional dependency, not installed by the two
# set-up commands. The CPU build comes from PyTorch's own index (about 200 MB) where it is reachable;
# otherwise, or with MEMTRADE_PEERS_CUDA=1, PyPI's default build (CUDA libraries included, several GB).
# PYTHON names the interpreter (default python3; a virtual environment's python keeps it apart).
set -euo pipefail
PY="${PYTHON:-python3}"
if "$PY" -c "import torch, transformers" 2>/dev/null; then
  echo "install_peers: $("$PY" -c 'import torch; print("torch", torch.__version__)') is installed"
  exit 0
fi
if [ "${MEMTRADE_PEERS_CUDA:-0}" != 1 ] &&
   "$PY" -m pip install -q --index-url https://download.pytorch.org/whl/cpu torch 2>/dev/null; then
  echo "install_peers: PyTorch's CPU build installed"
else
  echo "install_peers: installing PyPI's PyTorch build (with its CUDA libraries)"
  "$PY" -m pip install -q torch
fi
"$PY" -m pip install -q transformers
"$PY" -c "import torch; print('install_peers: torch', torch.__version__, 'CPU capability', torch.backends.cpu.get_cpu_capability())"
