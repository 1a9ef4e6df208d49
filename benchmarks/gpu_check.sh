#!/usr/bin/env bash
# One prepared GPU check of the Pallas kernels (momentum delta rule, grouped matmul, POET-X
# block rotation); its step timeouts add up to 8 minutes 15 s, within 10 minutes on one
# H200 with JAX 0.11.2 (the device image's python3 holds jax, torch, triton, pytest).
#
#   bash benchmarks/gpu_check.sh          # GPU: correctness (checks + pytest -m gpu), tuning,
#                                         # timings, XLA's compile
#   bash benchmarks/gpu_check.sh --cpu    # CPU half: interpret mode, tiny shapes, float32 and
#                                         # a bfloat16 run of the GPU-only paths (`make test-all` runs this
#                                         # through tests/pallas_kernels/test_mdn_pallas.py)
#
# Steps (GPU), each under its own timeout (150 + 90 + 60 + 60 + 90 + 45 s), GPU timings first:
# 1) python -m tools.kernel_audit.tuning --check at B=8 T=4096 H=6 K=128 V=256 bfloat16: the
# MDN forward against the recurrence at that shape and forward+gradients at a small one (also
# for the Mosaic GPU state kernel's candidates); then fwd+bwd of each kernel tiling/launch
# candidate (TUNE_CANDIDATES, at most ~120 s), and the fastest;
# 2) python -m benchmarks.kernels_mdn_gpu: medians after warm-up of the MDN Pallas fwd / fwd+bwd
# with the default parameters, the XLA chunk path, and fla-core's chunk_gated_delta_rule when
# present; the decode step;
# 3) python -m benchmarks.kernels_moe_gpu: one LatentMoE layer at the Nemotron 3 Super shape,
# 8192 tokens, bfloat16: the Pallas grouped matmul checked against ragged_dot (output and
# gradients), then fwd and fwd+bwd medians of both;
# 4) python -m benchmarks.kernels_poet --gpu: one POET-X layer fwd+bwd at the paper's shapes
# against a dense layer and naive POET;
# 5) pytest -m gpu tests/pallas_kernels/test_mdn_pallas.py (compiled kernels vs the recurrent
# reference, float32 at precision highest and bfloat16, K up to 256, gradients included);
# 6) python -m tools.kernel_audit.xla_aot: grid, shared memory, registers and spills of each
# kernel as XLA compiles it for an H200 (XLA's own Triton and ptxas).
# With $OUT set (the device tool), the whole log is also written to $OUT/gpu_check.log.
# Before spending GPU time, check on any machine that XLA compiles every kernel for an H200
# within its shared memory: `make xla-aot` (no GPU needed).
#
# What to carry: the repository's working tree (the device tool copies it) and, for the peer
# and the SASS columns, the wheels in .whl/. Fetch them once, in the repo root, on a machine
# with network access:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl fla-core==0.6.0 nvidia-cuda-nvdisasm==13.5.37
# and run this script with the device tool's carry=[".whl"]; it installs .whl/*.whl into
# /tmp/site itself (fla-core needs torch, triton and einops, all in the device image).
# Without .whl/ the fla rows are skipped with a note (and step 6 has no SASS columns).
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

# The kernel authors' tools (tools/kernel_audit, not installed) and the timing benchmark, which
# uses them, run as modules of the repo root, `"${AUDIT[@]}" <module> ...`: -P and the root last on the path, so that jaxlib_ext is
# the shim's (or the installed one), not the bare source folder.
audit_command() {
  AUDIT=(env "PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$REPO" "$PY" -P -W ignore::DeprecationWarning
         -m)
}

if [ "$MODE" = "cpu" ]; then
  export JAX_PLATFORMS=cpu
  echo "== CPU half: interpret mode, tiny shapes"
  audit_command
  "${AUDIT[@]}" tools.kernel_audit.tuning --cpu --check --dtype float32 || exit 1
  "${AUDIT[@]}" benchmarks.kernels_mdn_gpu --cpu --dtype float32 || exit 1
  "${AUDIT[@]}" benchmarks.kernels_moe_gpu --cpu --warmup 1 --iters 1 || exit 1
  # bfloat16 at K = 64, chunk 64, without --cpu: the paths only the GPU run takes otherwise
  # (the Mosaic GPU candidates' checks, the backward="xla" row, the XLA chunk row)
  echo "== CPU half: the GPU run's bfloat16 paths, interpreted"
  small=(--B 1 --T 128 --H 1 --K 64 --V 64 --warmup 1 --iters 1)
  "${AUDIT[@]}" tools.kernel_audit.tuning "${small[@]}" --check || exit 1
  exec "${AUDIT[@]}" benchmarks.kernels_mdn_gpu "${small[@]}" --skip-fla
fi

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

"$PY" -c "import jax; print('jax', jax.__version__, jax.devices())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null

# everything printed from here on is also kept in $OUT (the device tool brings it back)
[ -n "${OUT:-}" ] && exec > >(tee -a "$OUT/gpu_check.log") 2>&1

status=0
# GPU timings first: they are what only a GPU can give, and a later step that overruns its
# timeout must not cost them.
echo "== 1/6 MDN: checks against the recurrence, then tuning (fwd+bwd medians of the candidates)"
audit_command
timeout 150 "${AUDIT[@]}" tools.kernel_audit.tuning --check || status=1

echo "== 2/6 MDN timings (medians after warm-up), B=8 T=4096 H=6 K=128 V=256 bfloat16"
timeout 90 "${AUDIT[@]}" benchmarks.kernels_mdn_gpu || status=1

echo "== 3/6 MoE: LatentMoE layer, ragged_dot vs the Pallas grouped matmul (check, then timings)"
timeout 60 "${AUDIT[@]}" benchmarks.kernels_moe_gpu || status=1

echo "== 4/6 POET-X layer fwd+bwd (dense, naive POET, POET-X xla/pallas, memory modes), 4096x4096"
echo "   and 4096x14336, b=256, 2048 tokens, bfloat16 (paper, H100: 1.38 / 1.89 / 10.59 ms)"
timeout 60 "${AUDIT[@]}" benchmarks.kernels_poet --gpu --repeats 10 || status=1

echo "== 5/6 GPU correctness: pytest -m gpu (compiled Pallas Triton kernels vs recurrence)"
timeout 90 "$PY" -P -m pytest tests/pallas_kernels/test_mdn_pallas.py -m gpu -q -x \
  -p no:cacheprovider -W ignore::DeprecationWarning || status=1

echo "== 6/6 what XLA compiled: grid, shared memory, registers, spills per kernel (xla_aot)"
# The same deviceless compile as offline (JAX_PLATFORMS=cpu: the GPU is not touched), here with
# the image's own ptxas; the PTX and ptxas logs come back in $OUT/xla_aot.
timeout 45 "${AUDIT[@]}" tools.kernel_audit.xla_aot --no-xla-chunk ${OUT:+--keep "$OUT/xla_aot"} \
  || true
[ -n "${OUT:-}" ] && rm -rf "$OUT/xla_aot/dump" "$OUT/xla_aot/cuda"

echo "== gpu_check exit status: $status"
exit $status
