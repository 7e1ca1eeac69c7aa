#!/bin/sh
# make_venv.sh: create the Python venv in which bench_adamw times its peers, PyTorch's fused
# CPU AdamW and DeepSpeed's DeepSpeedCPUAdam (bench/peers/adamw_peers.py), and in which
# bench/train_step_vs_torch.sh runs torch.compile's training step (torch_train_step.py, which
# needs torch only; torch.compile also needs a C++ compiler, g++).  For a person running
# benchmarks by hand; never run by CI or the test suite (the download is gigabytes).
#
# usage: bench/peers/make_venv.sh            (ZS_PEERS_VENV picks the path)
#        ZS_PEERS_PYTHON=$venv/bin/python build/bench/bench_adamw 2 124
#        ZS_PEERS_PYTHON=$venv/bin/python bench/train_step_vs_torch.sh build 2 3 3
#
# The venv lives outside the tree, so that no ignore rule is needed.  torch comes from
# PyTorch's CPU-only index when it is reachable; otherwise from PyPI, whose Linux wheel
# pulls in the CUDA libraries too (unused here, but several GB).  deepspeed ships as source
# whose setup.py imports torch, hence --no-build-isolation after torch is in.  Its CPU Adam op
# is compiled on first use (ninja, g++, the interpreter's headers); adamw_peers.py reports it
# when that fails.  Silent on stdout; pip's warnings and errors go to stderr.
set -eu

venv=${ZS_PEERS_VENV:-$HOME/.cache/zshard-peers-venv}
python=${PYTHON:-python3}
cpu_index=https://download.pytorch.org/whl/cpu

"$python" -m venv "$venv" >&2
pip="$venv/bin/python -m pip --quiet --disable-pip-version-check"
$pip install --upgrade pip setuptools wheel >&2
if ! $pip install --index-url "$cpu_index" torch >&2; then
    echo "make_venv.sh: $cpu_index not reachable; installing torch from PyPI (with CUDA libraries)" >&2
    $pip install torch >&2
fi
$pip install ninja py-cpuinfo numpy packaging psutil pydantic tqdm hjson msgpack >&2
$pip install --no-build-isolation deepspeed >&2
echo "make_venv.sh: ready; run bench_adamw with ZS_PEERS_PYTHON=$venv/bin/python" >&2
