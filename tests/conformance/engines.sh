#!/usr/bin/env bash
# The engines' own Python code for tests/conformance/, each pip-installed into a directory of its
# own under .engines/ (never into the project's venv): a conformance test runs the engine in a
# subprocess with PYTHONPATH=.engines/<engine>:tests/conformance/torch_npu_stand_in:<repo> and the
# project's python and torch.
#
#   tests/conformance/engines.sh          (after `. .venv/bin/activate`; .ci/run calls it)
#
# MindIE-SD 3.1.0 (PyPI `mindiesd`, a cp311 manylinux wheel: Python 3.11): its Python code is
# what the test runs; its native libraries (ops/vendors/*.so, plugin/torch21x/libPTAExtensionOPS.so)
# are never loaded, since the torch_npu stand-in reports no NPU. `--no-deps`: its declared
# dependencies are torch (the project's) and torch-npu (the stand-in); what it imports besides
# (torch, safetensors: the project's) is einops; strenum only on Python < 3.11; triton and
# wcmatch are optional (imported in try/except).
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR="${OPSNN_QUANT_ENGINES:-$PWD/.engines}"
PY="${PYTHON:-python}"

install() {  # install NAME PIP-ARGS...: into $DIR/NAME, atomically (a failed install leaves none)
  local name="$1" target="$DIR/$1"
  shift
  if [ -f "$target/.complete" ]; then
    return 0
  fi
  rm -rf "$target" "$target.partial"
  mkdir -p "$DIR"
  "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$target.partial" "$@"
  touch "$target.partial/.complete"
  mv "$target.partial" "$target"
  echo "engines: $name in $target"
}

if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "engines: mindiesd 3.1.0 ships a cp311 wheel only; $("$PY" -V) cannot install it" >&2
  exit 1
fi
install mindiesd-3.1.0 mindiesd==3.1.0 einops==0.8.2
