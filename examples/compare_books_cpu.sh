#!/usr/bin/env bash
# The same-budget comparison on the offline books corpus (SmolLM2-135M, CPU): HMT against the chunked backbone
# (L=256 and L=1024) and RMT, each trained on the same windows, steps, tokens and LR schedule
# (examples/train_args_books_cpu.json), then scored on the held-out test plays and on Wikipedia.
# Resumable: rerun after an interruption; finished stages are skipped, unfinished ones resume from their checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=.
runs=${RUNS:-runs/books-cpu}
report=${REPORT:-reports/books_cpu}
[ -d data/books ] || hmt-hf prepare-data books --output-dir data/books
[ -d data/wiki ] || hmt-hf prepare-data wiki --output-dir data/wiki
train() {  # name, extra flags: two runs at a time, one thread each
  python examples/train_hmt.py examples/train_args_books_cpu.json --output_dir "$runs/$1" \
    --resume_from_checkpoint last "${@:2}" > "$runs/$1.log" 2>&1
}
mkdir -p "$runs"
# `wait PID` returns that run's status, so the script stops if a run fails.
train hmt --method hmt & first=$!; train chunked --method chunked & second=$!; wait $first; wait $second
# L=1024 chunks: one segment per window, as many tokens per stage as the L=256 runs (stage 1: 30 x 1,024 = 60 x 512).
train rmt --method rmt & first=$!
train chunked-1024 --method chunked --segment_length 1024 --stage1_bptt_depth 1 --stage1_max_steps 30 --bptt_depth 1 &
second=$!; wait $first; wait $second
models=(--checkpoint "chunked (L=256)=$runs/chunked/backbone" --checkpoint "HMT=$runs/hmt/stage2"
        --checkpoint "RMT=$runs/rmt/stage2" --checkpoint "chunked (L=1024)=$runs/chunked-1024/backbone")
# Held-out test documents of the training corpus, and Wikipedia (not trained on); one process each.
python benchmarks/memory_quality.py trained --corpora books --lengths 2048,8192,16384 --num-samples 3 \
  --max-tokens 32768 --diagnostics-length 8192 --threads 1 --output "$report/books" "${models[@]}" &
first=$!
python benchmarks/memory_quality.py trained --corpora wiki --lengths 2048,8192 --num-samples 3 \
  --diagnostics-length 8192 --threads 1 --output "$report/wiki" "${models[@]}" &
second=$!; wait $first; wait $second
