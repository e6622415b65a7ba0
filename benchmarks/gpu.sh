#!/usr/bin/env bash
# The GPU figures of docs/performance.md in one go, on one GPU (about 7 minutes on an H100/H200):
#   1. benchmarks/train_step.py, bf16: albert base at S=128 and albert large at S=512, ours against
#      PyTorch's AlbertForPreTraining (autocast bf16) in the same process, then ours with
#      model.attention_impl=flash (cuDNN's fused attention), albert large unrolled at B=128
#      (scan_layers=false), and data.packing on short documents at S=128 and 512;
#   2. the README's main job (configs/tiny.py on the built-in corpus) on the GPU, end to end, in
#      /tmp/albert_gpu_tiny (removed first; only its console log is kept, in OUT).
# (benchmarks/finetune.py runs PyTorch on the CPU only: not part of this.)
# Each part has its own time limit and log (OUT/<part>.log); one that fails does not stop the rest.
#   bash benchmarks/gpu.sh [OUT]      # OUT defaults to ./gpu_out
set -uo pipefail
cd "$(dirname "$0")/.." || exit
out=${1:-gpu_out}
py=${PYTHON:-python3}
mkdir -p "$out"
# jax and torch share the card: jax takes half of it up front instead of 75%.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.5}
export PYTHONUNBUFFERED=1

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  "$py" -c "import jax, flax, optax, torch, transformers; print('jax', jax.__version__, jax.devices(), \
'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, \
'transformers', transformers.__version__)"
} 2>&1 | tee "$out/env.log"

part() { # name, seconds, command...: runs it with a limit, keeps its log, shows the end
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit} s)"
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - start)) s" | tee -a "$out/$name.log"
  tail -n "${TAIL:-14}" "$out/$name.log"
}

base=(--model=albert_base --batch=64 --seq=128 --dtype=bfloat16 --matmul_size=8192)
large=(--model=albert_large --batch=32 --seq=512 --dtype=bfloat16 --matmul_size=8192)
part train_base_s128 100 "$py" benchmarks/train_step.py "${base[@]}" --steps=10
part train_large_s512 100 "$py" benchmarks/train_step.py "${large[@]}" --steps=10
TAIL=6 part flash_base_s128 60 "$py" benchmarks/train_step.py "${base[@]}" --steps=10 \
  --attention_impl=flash --skip_torch
TAIL=6 part flash_large_s512 60 "$py" benchmarks/train_step.py "${large[@]}" --steps=10 \
  --attention_impl=flash --skip_torch
# Unrolled layers (scan_layers=false: the scan's stacking copies cost 29% of a GPU step) at B=128,
# and data.packing on short documents (unpacked rows through cuDNN, packed through the einsum path).
TAIL=6 part flash_large_s512_unrolled 100 "$py" benchmarks/train_step.py "${large[@]}" --steps=6 \
  --batch=128 --attention_impl=flash --skip_torch --model_set=scan_layers=false
TAIL=2 part packed_base_s128 80 "$py" benchmarks/train_step.py --model=albert_base --seq=128 \
  --batch=128 --dtype=bfloat16 --packing_mean_tokens=40 --attention_impl=flash --steps=8
TAIL=2 part packed_base_s512 80 "$py" benchmarks/train_step.py --model=albert_base --seq=512 \
  --batch=32 --dtype=bfloat16 --packing_mean_tokens=40 --attention_impl=flash --steps=8
rm -rf /tmp/albert_gpu_tiny
TAIL=24 part main_tiny 120 "$py" -m albert_jax.main --config=configs/tiny.py \
  --workdir=/tmp/albert_gpu_tiny
