#!/usr/bin/env bash
# examples/compare_books_cpu.sh with twice the stage-2 budget: 240 steps (245,760 tokens) instead of 120, for all four
# models alike. Each model continues its 120-step run from that run's checkpoint-120 (copied, so the 120-step run stays
# as it is); resuming is exact (tests/test_training.py), so this equals an uninterrupted 240-step run. Resumable.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=.
short=${SHORT:-runs/books-cpu}
runs=${RUNS:-runs/books-cpu-240}
report=${REPORT:-reports/books_cpu_240}
steps=${STEPS:-240}
seed() {  # stage 1 as it finished (without its checkpoints), stage 2 from step 120
  [ -e "$runs/$1/stage1/train_results.json" ] && return 0
  mkdir -p "$runs/$1/stage1" "$runs/$1/stage2"
  find "$short/$1/stage1" -mindepth 1 -maxdepth 1 ! -name 'checkpoint-*' -exec cp -r {} "$runs/$1/stage1/" \;
  cp -r "$short/$1/stage2/checkpoint-120" "$runs/$1/stage2/"
  # Checkpoints written before the schedule became a LambdaLR lack its `lr_lambdas` entry (same schedule, same step).
  python -c "import sys, torch; p = sys.argv[1]; s = torch.load(p, weights_only=False)
if 'lr_lambdas' not in s: torch.save({**s, 'lr_lambdas': [None] * len(s['base_lrs'])}, p)" \
    "$runs/$1/stage2/checkpoint-120/scheduler.pt"
}
train() {  # name, extra flags: two runs at a time, one thread each
  seed "$1"
  python examples/train_hmt.py examples/train_args_books_cpu.json --output_dir "$runs/$1" --max_steps "$steps" \
    --resume_from_checkpoint last "${@:2}" > "$runs/$1.log" 2>&1
}
mkdir -p "$runs"
# `wait PID` returns that run's status, so the script stops if a run fails.
train hmt --method hmt & first=$!; train chunked --method chunked & second=$!; wait $first; wait $second
train rmt --method rmt & first=$!
train chunked-1024 --method chunked --segment_length 1024 --stage1_bptt_depth 1 --stage1_max_steps 30 --bptt_depth 1 &
second=$!; wait $first; wait $second
models=(--checkpoint "chunked (L=256)=$runs/chunked/backbone" --checkpoint "HMT=$runs/hmt/stage2"
        --checkpoint "RMT=$runs/rmt/stage2" --checkpoint "chunked (L=1024)=$runs/chunked-1024/backbone")
python benchmarks/memory_quality.py trained --corpora books --lengths 2048,8192,16384 --num-samples 3 \
  --max-tokens 32768 --diagnostics-length 8192 --threads 1 --output "$report/books" "${models[@]}" &
first=$!
python benchmarks/memory_quality.py trained --corpora wiki --lengths 2048,8192 --num-samples 3 \
  --diagnostics-length 8192 --threads 1 --output "$report/wiki" "${models[@]}" &
second=$!; wait $first; wait $second
