#!/usr/bin/env bash
# One prepared GPU check of the momentum delta rule Pallas kernels (issue 4); fits in 10 minutes
# on one H200 with JAX 0.11.2 (the device image's python3 holds jax, torch, triton, pytest).
#
#   bash benchmarks/gpu_check.sh          # GPU: correctness (pytest -m gpu + checks) and timings
#   bash benchmarks/gpu_check.sh --cpu    # CPU half: interpret mode, tiny shapes, float32 and
#                                         # a bfloat16 run of the GPU-only paths (CI runs this
#                                         # through tests/pallas_kernels/test_mdn_pallas.py)
#
# Steps (GPU), each under its own timeout (360 + 60 + 150 s), timings first:
# 1) benchmarks/mdn_gpu.py --check --tune at B=8 T=4096 H=6 K=128 V=256 bfloat16: forward vs
# the recurrence at that shape and forward+gradients at a small one; fwd+bwd of a few kernel
# tilings/launch configs (TUNE_CANDIDATES, at most ~120 s), keeping the fastest; then medians
# after warm-up of pallas fwd / fwd+bwd, the XLA chunk path, and fla-core's
# chunk_gated_delta_rule when present; 2) grid, shared memory, registers and spills of each
# kernel as XLA compiles it for an H200 (benchmarks/xla_aot.py: XLA's own Triton and ptxas);
# 3) pytest -m gpu tests/pallas_kernels/test_mdn_pallas.py (compiled kernels vs the recurrent
# reference, float32 at precision highest and bfloat16, K up to 256, gradients included).
# With $OUT set (the device tool), the whole log is also written to $OUT/gpu_check.log.
# Before spending GPU time, check on any machine that XLA compiles every kernel for an H200
# within its shared memory: `make xla-aot` (benchmarks/xla_aot.py, no GPU needed).
#
# The peer (fla-core, pure Python) travels as a wheel in .whl/. Fetch it once, in the repo root,
# on a machine with network access:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl fla-core==0.6.0 nvidia-cuda-nvdisasm==13.5.37
# and run this script with the device tool's carry=[".whl"]; it installs .whl/*.whl into
# /tmp/site itself (fla-core needs torch, triton and einops, all in the device image).
# Without .whl/ the fla rows are skipped with a note (and step 2 has no SASS columns).
set -u
cd "$(dirname "$0")/.."
REPO="$(pwd)"
PY="${PYTHON:-python3}"
MODE="gpu"
[ "${1:-}" = "--cpu" ] && MODE="cpu"
export PYTHONUNBUFFERED=1

# jaxlib_ext importable without pip: a shim folder mapping the namespace onto the repo folders
# (what pyproject's package-dir does for an installed copy).
if ! "$PY" -P -c "import jaxlib_ext.pallas_kernels.mdn" >/dev/null 2>&1; then
  SHIM="$(mktemp -d /tmp/jaxlib_ext_shim.XXXXXX)"
  cp -r "$REPO/jaxlib_ext" "$SHIM/jaxlib_ext"
  for pkg in models optim samplers pallas_kernels; do
    ln -s "$REPO/$pkg" "$SHIM/jaxlib_ext/$pkg"
  done
  export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi

if [ "$MODE" = "cpu" ]; then
  export JAX_PLATFORMS=cpu
  echo "== CPU half: interpret mode, tiny shapes"
  "$PY" benchmarks/mdn_gpu.py --cpu --check --tune --dtype float32 || exit 1
  # bfloat16 at K = 64, chunk 64, without --cpu: the paths only the GPU run takes otherwise
  # (the Mosaic GPU candidates' checks, the backward="xla" row, the XLA chunk row)
  echo "== CPU half: the GPU run's bfloat16 paths, interpreted"
  exec "$PY" benchmarks/mdn_gpu.py --B 1 --T 128 --H 1 --K 64 --V 64 --check --tune \
    --skip-fla --warmup 1 --iters 1
fi

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi

"$PY" -c "import jax; print('jax', jax.__version__, jax.devices())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null

# everything printed from here on is also kept in $OUT (the device tool brings it back)
[ -n "${OUT:-}" ] && exec > >(tee -a "$OUT/gpu_check.log") 2>&1

status=0
# Timings first: they are what only a GPU can give, and a later step that overruns its
# timeout must not cost them.
echo "== 1/3 tuning, then timings (medians after warm-up), B=8 T=4096 H=6 K=128 V=256 bfloat16"
timeout 360 "$PY" -W ignore::DeprecationWarning benchmarks/mdn_gpu.py --check --tune || status=1

echo "== 2/3 what XLA compiled: grid, shared memory, registers, spills per kernel (xla_aot.py)"
# The same deviceless compile as offline (JAX_PLATFORMS=cpu: the GPU is not touched), here with
# the image's own ptxas; the PTX and ptxas logs come back in $OUT/xla_aot.
timeout 60 "$PY" benchmarks/xla_aot.py --no-xla-chunk ${OUT:+--keep "$OUT/xla_aot"} || true
[ -n "${OUT:-}" ] && rm -rf "$OUT/xla_aot/dump" "$OUT/xla_aot/cuda"

echo "== 3/3 GPU correctness: pytest -m gpu (compiled Pallas Triton kernels vs recurrence)"
timeout 150 "$PY" -P -m pytest tests/pallas_kernels/test_mdn_pallas.py -m gpu -q -x \
  -p no:cacheprovider -W ignore::DeprecationWarning || status=1

echo "== gpu_check exit status: $status"
exit $status
