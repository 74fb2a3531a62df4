# The Python that quickstart.sh and .ci/run use, sourced by both from the project's root. It sets PY, puts PY's
# folder first on PATH (so `python`, `torchrun` and the tests' subprocesses are that Python) and installs nothing:
#   1. an environment you activated (a venv: VIRTUAL_ENV; conda: CONDA_PREFIX) is used as it is;
#   2. else the project's own .venv/, if an earlier run made it;
#   3. else a `python` or `python3` on PATH that already imports torch (a GPU image's Python with its CUDA torch);
#   4. else .venv/ is made here with the system's `python3 -m venv` (ignored by git) and used from then on.
# install_torch installs the CPU wheel of torch only where none imports, so an installed (CUDA) torch is never
# replaced and nothing pulls the CUDA build unasked. After the quick start: `source .venv/bin/activate`, or call
# `.venv/bin/python train.py ...`.
if [[ -n ${VIRTUAL_ENV:-} ]]; then
  PY=$VIRTUAL_ENV/bin/python
elif [[ -n ${CONDA_PREFIX:-} ]]; then
  PY=$CONDA_PREFIX/bin/python
elif [[ -x .venv/bin/python ]]; then
  PY=$PWD/.venv/bin/python
else
  PY=
  for candidate in python python3; do
    if command -v "$candidate" > /dev/null && "$candidate" -c "import torch" 2> /dev/null; then
      PY=$(command -v "$candidate"); break
    fi
  done
  if [[ -z $PY ]]; then
    command -v python3 > /dev/null || { echo "error: no python3 on PATH; install Python 3.10 or newer" >&2; exit 1; }
    echo "making the project's environment .venv/ with $(python3 --version) (python3 -m venv); later: source .venv/bin/activate"
    python3 -m venv .venv || { rm -rf .venv; echo "error: python3 -m venv failed (Debian/Ubuntu: apt install python3-venv)" >&2; exit 1; }
    PY=$PWD/.venv/bin/python
  fi
fi
export PATH="$(dirname "$PY"):$PATH"
[[ $PY == "$PWD/.venv/bin/python" ]] && export VIRTUAL_ENV=$PWD/.venv
install_torch() {         # the CPU wheel where no torch imports (its dependencies from the usual index); any torch stays
  "$PY" -c "import torch" 2> /dev/null && return
  "$PY" -m pip install -q --no-deps "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  "$PY" -m pip install -q "torch==2.13.0"
}
