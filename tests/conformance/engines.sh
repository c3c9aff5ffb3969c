#!/usr/bin/env bash
# The engines' own Python code for tests/conformance/ (and msModelSlim's, the peer whose files
# they read), each installed into a directory of its own under .engines/ (never into the
# project's venv): a conformance test runs the engine in a subprocess with
# PYTHONPATH=.engines/<engine>...:tests/conformance/torch_npu_stand_in:<repo> and the project's
# python and torch (msModelSlim: PYTHONPATH=.engines/msmodelslim-26.1.0 alone).
#
#   tests/conformance/engines.sh          (after `. .venv/bin/activate`; .ci/run calls it)
#
# OPSNN_QUANT_ENGINES: where (default .engines/). OPSNN_QUANT_ENGINE_DOWNLOADS: a directory that
# may already hold the vllm wheel and the vllm-ascend sdist (checked against the same sha256s),
# to skip their download.
#
# No package index is named here: the two files pinned below (name and sha256) are looked up in
# the indexes pip itself is configured with (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL, `pip config`'s
# index-url and extra-index-url, else the default index pip holds), through the simple
# repository API (PEP 691 JSON, PEP 503 HTML), and downloaded from the address that index gives;
# the sha256 decides whether the bytes are the pinned ones, wherever they came from.
#
# MindIE-SD 3.1.0 (PyPI `mindiesd`, a cp311 manylinux wheel: Python 3.11): its Python code is
# what the test runs; its native libraries (ops/vendors/*.so, plugin/torch21x/libPTAExtensionOPS.so)
# are never loaded, since the torch_npu stand-in reports no NPU. `--no-deps`: its declared
# dependencies are torch (the project's) and torch-npu (the stand-in); what it imports besides
# (torch, safetensors: the project's) is einops; strenum only on Python < 3.11; triton and
# wcmatch are optional (imported in try/except).
#
# msModelSlim 26.1.0 (PyPI `msmodelslim`, a py3 wheel with per-Python native helpers): the peer
# whose own files tests/conformance/test_msmodelslim_peer.py reads, run as the benchmark runs it
# (benchmarks/peer_msmodelslim.py: its llm_ptq Calibrator on the CPU, no torch_npu). `--no-deps`:
# of its declared dependencies its llm_ptq import closure needs easydict (pinned by it, 1.13) and
# einops beyond the project's venv (torch, accelerate, pydantic, scipy, requests: the project's;
# wcmatch and pygtrie are not imported there).
#
# vLLM 0.23.0 (PyPI `vllm`, a manylinux abi3 wheel built for CUDA and torch 2.11): its Python
# files only. The wheel is fetched (pinned by file name and sha256, from pip's indexes) and
# unpacked without its *.so (vllm/_C.abi3.so, the flash-attention and MoE kernels...): nothing
# native of it exists here,
# and vLLM imports it guarded (vllm/platforms/interface.py:250-257). Its declared dependencies
# are not installed (`--no-deps` in effect): torch is the project's; the pure-Python or CPU-wheel
# packages the conformance test's import closure needs and the project's venv lacks are
# installed, pinned, into the same directory (VLLM_DEPS below; vllm 0.23.0's METADATA bounds).
#
# vllm-ascend 0.23.0.post1 (PyPI `vllm-ascend`): an sdist only, whose build (setup.py: CMake,
# CANN, triton-ascend==3.2.2) cannot run here: `pip download`/`pip install` of it fails. The
# tarball is fetched (pinned by file name and sha256, from pip's indexes) and its `vllm_ascend/`
# Python package unpacked, plus the one file its build generates, vllm_ascend/_build_info.py
# (setup.py:153-193 gen_build_info:
# `__device_type__` from the SoC, here 'A2' = Atlas A2 / 910B, as the 910B targets are).
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR="${OPSNN_QUANT_ENGINES:-$PWD/.engines}"
PY="${PYTHON:-python}"

VLLM_VERSION=0.23.0
VLLM_WHEEL=vllm-0.23.0-2-cp38-abi3-manylinux_2_28_x86_64.whl
VLLM_SHA256=872aeb7c36a1ea942216af067ce870ffdf960804e829367e1b4eb36d4831c03c
ASCEND_VERSION=0.23.0.post1
ASCEND_SDIST=vllm_ascend-0.23.0.post1.tar.gz
ASCEND_SHA256=a3b9f4a5dd7aa50c37e03d1f35937c4ae5aeacc49b734cac74d59ce5757738e1
# What vLLM's and vllm-ascend's import closure (vLLM's config, loader, Linear layers, Whisper
# model; vllm-ascend's ModelSlim config, linear methods, Ascend ops) needs beyond the project's
# venv, each within vllm 0.23.0's Requires-Dist (compressed-tensors pinned there, ==0.17.0).
VLLM_DEPS=(
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 attrs==26.1.0 cachetools==8.0.2
  cbor2==6.3.0 cloudpickle==3.1.3 compressed-tensors==0.17.0 einops==0.8.2 frozenlist==1.8.0
  gguf==0.19.0 msgspec==0.23.0 multidict==7.2.1 openai==3.63.0 openai-harmony==0.0.8
  prometheus-client==0.26.0 propcache==0.5.4 py-cpuinfo==9.0.0 pybase64==1.5.1 pyzmq==27.3.0
  sniffio==1.3.1 uvloop==0.23.0 yarl==1.25.1
)

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

fetch() {  # fetch FILE PROJECT SHA256 -> prints the path of the verified file
  "$PY" - "$@" "${OPSNN_QUANT_ENGINE_DOWNLOADS:-}" "$DIR/.downloads" <<'EOF'
import hashlib, html, json, os, re, shutil, subprocess, sys, urllib.parse, urllib.request
name, project, sha, cache, into = sys.argv[1:6]

def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

def indexes():
    """The indexes pip would search, in its order: its index-url, then its extra-index-urls."""
    main, extra = os.environ.get("PIP_INDEX_URL"), os.environ.get("PIP_EXTRA_INDEX_URL", "").split()
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True).stdout.splitlines()
    for line in listed:
        key, _, value = line.partition("=")
        value = value.strip().strip("'\"")
        if key.endswith(".index-url") and not main:
            main = value
        elif key.endswith(".extra-index-url"):
            extra += value.split()
    if not main:
        from pip._internal.models.index import PyPI  # the default pip itself holds
        main = PyPI.simple_url
    return [main, *extra]

def locate(index):
    """The download address of ``name`` on ``index`` (simple API), or None."""
    page = index.rstrip("/") + "/" + re.sub(r"[-_.]+", "-", project).lower() + "/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    try:
        with urllib.request.urlopen(urllib.request.Request(page, headers={"Accept": accept}),
                                    timeout=120) as r:
            kind, body = r.headers.get("Content-Type", ""), r.read()
    except (OSError, ValueError):
        return None
    if "json" in kind:
        links = [(f["filename"], f["url"]) for f in json.loads(body).get("files", [])]
    else:
        links = [(html.unescape(text).strip(), html.unescape(href)) for href, text in
                 re.findall(r'<a[^>]*href="([^"]+)"[^>]*>([^<]*)</a>', body.decode("utf-8", "replace"))]
    for filename, url in links:
        if filename == name:
            return urllib.parse.urljoin(page, url)
    return None

for path in (os.path.join(cache, name) if cache else "", os.path.join(into, name)):
    if path and os.path.isfile(path) and digest(path) == sha:
        print(path)
        sys.exit(0)
searched = indexes()
url = next((u for u in map(locate, searched) if u), None)
if url is None:
    sys.exit(f"engines: {name} is on none of pip's indexes ({len(searched)} searched)")
os.makedirs(into, exist_ok=True)
path, part = os.path.join(into, name), os.path.join(into, name + ".part")
with urllib.request.urlopen(url, timeout=120) as r, open(part, "wb") as f:
    shutil.copyfileobj(r, f, 1 << 20)
got = digest(part)
if got != sha:
    os.remove(part)
    sys.exit(f"engines: {name}: sha256 {got}, expected {sha}")
os.replace(part, path)
print(path)
EOF
}

if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "engines: mindiesd 3.1.0 ships a cp311 wheel only; $("$PY" -V) cannot install it" >&2
  exit 1
fi
install mindiesd-3.1.0 mindiesd==3.1.0 einops==0.8.2
install msmodelslim-26.1.0 msmodelslim==26.1.0 easydict==1.13 einops==0.8.2
PYTHONPATH="$DIR/msmodelslim-26.1.0" "$PY" -c '
from msmodelslim.pytorch.llm_ptq.llm_ptq_tools import Calibrator, QuantConfig
' >"$DIR/.msmodelslim-import-check.log" 2>&1 || {
  tail -5 "$DIR/.msmodelslim-import-check.log" >&2
  echo "engines: msmodelslim 26.1.0 does not import (log: $DIR/.msmodelslim-import-check.log)" >&2
  exit 1
}

# vLLM: its pinned dependencies, then the wheel's files but its native libraries
VLLM_DIR="$DIR/vllm-$VLLM_VERSION"
if [ ! -f "$VLLM_DIR/.complete" ]; then
  wheel="$(fetch "$VLLM_WHEEL" vllm "$VLLM_SHA256")"
  rm -rf "$VLLM_DIR" "$VLLM_DIR.partial"
  "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$VLLM_DIR.partial" \
    "${VLLM_DEPS[@]}"
  "$PY" - "$wheel" "$VLLM_DIR.partial" <<'EOF'
import sys, zipfile
wheel, into = sys.argv[1:3]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if ".so" not in n.rsplit("/", 1)[-1]]
    z.extractall(into, names)
EOF
  touch "$VLLM_DIR.partial/.complete"
  mv "$VLLM_DIR.partial" "$VLLM_DIR"
  rm -f "$DIR/.downloads/$VLLM_WHEEL"
  echo "engines: vllm $VLLM_VERSION (no native libraries) in $VLLM_DIR"
fi

# vllm-ascend: the sdist's Python package and the file its build would generate
ASCEND_DIR="$DIR/vllm-ascend-$ASCEND_VERSION"
if [ ! -f "$ASCEND_DIR/.complete" ]; then
  sdist="$(fetch "$ASCEND_SDIST" vllm-ascend "$ASCEND_SHA256")"
  rm -rf "$ASCEND_DIR" "$ASCEND_DIR.partial"
  "$PY" - "$sdist" "$ASCEND_DIR.partial" "vllm_ascend-$ASCEND_VERSION/" <<'EOF'
import os, sys, tarfile
sdist, into, top = sys.argv[1:4]
with tarfile.open(sdist) as t:
    members = [m for m in t.getmembers() if m.name.startswith(top + "vllm_ascend/")]
    for m in members:
        m.name = m.name[len(top):]
    t.extractall(into, members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
with open(os.path.join(into, "vllm_ascend", "_build_info.py"), "w") as f:
    # what setup.py gen_build_info (153-193) writes for an Atlas A2 (910B) SoC
    f.write("# Auto-generated file\n__device_type__ = 'A2'\n")
EOF
  touch "$ASCEND_DIR.partial/.complete"
  mv "$ASCEND_DIR.partial" "$ASCEND_DIR"
  rm -f "$DIR/.downloads/$ASCEND_SDIST"
  echo "engines: vllm-ascend $ASCEND_VERSION (Python package) in $ASCEND_DIR"
fi

# the engine's import closure in its environment (a venv lacking one of the packages vLLM takes
# from it fails here, with the name, not in a test)
PYTHONPATH="$VLLM_DIR:$ASCEND_DIR:$PWD/tests/conformance/torch_npu_stand_in" "$PY" -c '
import vllm.model_executor.models.whisper, vllm.model_executor.model_loader
import vllm_ascend.quantization.modelslim_config, vllm_ascend.ops.linear
import vllm_ascend.quantization.methods.w8a8_static, vllm_ascend.quantization.methods.w8a8_dynamic
' >"$DIR/.import-check.log" 2>&1 || {
  tail -5 "$DIR/.import-check.log" >&2
  echo "engines: vllm $VLLM_VERSION / vllm-ascend $ASCEND_VERSION do not import (log: $DIR/.import-check.log)" >&2
  exit 1
}
