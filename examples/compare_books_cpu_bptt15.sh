#!/usr/bin/env bash
# Stage 2 at the paper's BPTT depth (15 segments per window) with the token budget of the 240-step runs:
# 64 steps x 15 x 256 = 245,760 stage-2 tokens, as 240 x 4 x 256. HMT, RMT and the chunked L=256 baseline start from
# their stage-1 runs in runs/books-cpu-240 (same flags) and train on the same 15-segment windows; then they are scored
# on the held-out books test plays and on Wikipedia beside the 240-step chunked L=1024 run (the same 245,760 stage-2
# tokens as 240 one-segment windows: 3,840 tokens do not split into 1,024-token segments). Two runs at a time (HMT
# needs ~11 GB at this depth, the others 8-9 GB: three do not fit in 24 GB). Resumable (rerun after an interruption).
# Writes reports/books_cpu_bptt15/{books,wiki}.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=.
runs=${RUNS:-runs/books-cpu-bptt15}
for model in hmt rmt chunked; do  # stage 1 as finished in runs/books-cpu-240 (without its checkpoints)
  [ -e "$runs/$model/stage1/train_results.json" ] || { mkdir -p "$runs/$model/stage1"
    find "runs/books-cpu-240/$model/stage1" -mindepth 1 -maxdepth 1 ! -name 'checkpoint-*' \
      -exec cp -r {} "$runs/$model/stage1/" \; ; }
done
train() {
  python examples/train_hmt.py examples/train_args_books_cpu.json --output_dir "$runs/$1" --bptt_depth 15 \
    --max_steps 64 --save_steps 8 --resume_from_checkpoint last "${@:2}" > "$runs/$1.log" 2>&1
}
train hmt --method hmt & first=$!; train chunked --method chunked & second=$!; wait $second
train rmt --method rmt; wait $first
models=(--checkpoint "chunked (L=256)=$runs/chunked/backbone" --checkpoint "HMT=$runs/hmt/stage2"
        --checkpoint "RMT=$runs/rmt/stage2" --checkpoint "chunked (L=1024)=runs/books-cpu-240/chunked-1024/backbone")
report=${REPORT:-reports/books_cpu_bptt15}
# Held-out test documents of the training corpus, and Wikipedia (not trained on); one process each.
python benchmarks/memory_quality.py trained --corpora books --lengths 2048,8192,16384 --num-samples 3 \
  --max-tokens 32768 --diagnostics-length 8192 --threads 1 --output "$report/books" "${models[@]}" & first=$!
python benchmarks/memory_quality.py trained --corpora wiki --lengths 2048,8192 --num-samples 3 \
  --diagnostics-length 8192 --threads 1 --output "$report/wiki" "${models[@]}" & second=$!
wait $first; wait $second
