#!/usr/bin/env bash
# The same-budget comparison on the offline books corpus (SmolLM2-135M, CPU): HMT against the chunked backbone
# (L=256 and L=1024) and RMT, each trained on the same windows, steps, tokens and LR schedule
# (examples/train_args_books_cpu.json), then scored on the held-out test plays and on Wikipedia.
# Resumable: rerun after an interruption; finished stages are skipped, unfinished ones resume from their checkpoint.
# STEPS sets the stage-2 steps (default 120); CONTINUE_FROM=DIR starts each model from DIR's run of it (stage 1 as
# finished, stage 2 from its newest checkpoint), which equals an uninterrupted run since resuming is exact.
# MEMORY_LR sets --memory_learning_rate (the memory parameters' LR; the chunked runs have none to train); HMT_FLAGS
# adds flags to the HMT run only (e.g. "--memory_readout segment_mean").
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=.
runs=${RUNS:-runs/books-cpu}
report=${REPORT:-reports/books_cpu}
steps=${STEPS:-120}
[ -d data/books ] || hmt-hf prepare-data books --output_dir data/books
[ -d data/wiki ] || hmt-hf prepare-data wiki --output_dir data/wiki
seed() {  # copy CONTINUE_FROM's run: stage 1 without its checkpoints, stage 2's newest checkpoint
  [ -n "${CONTINUE_FROM:-}" ] && [ ! -e "$runs/$1/stage1/train_results.json" ] || return 0
  local checkpoint
  checkpoint=$(ls -d "$CONTINUE_FROM/$1/stage2"/checkpoint-* | sort -V | tail -1)
  mkdir -p "$runs/$1/stage1" "$runs/$1/stage2"
  find "$CONTINUE_FROM/$1/stage1" -mindepth 1 -maxdepth 1 ! -name 'checkpoint-*' -exec cp -r {} "$runs/$1/stage1/" \;
  cp -r "$checkpoint" "$runs/$1/stage2/"
  # Checkpoints written before the schedule became a LambdaLR lack its `lr_lambdas` entry (same schedule, same step).
  python -c "import sys, torch; p = sys.argv[1]; s = torch.load(p, weights_only=False)
if 'lr_lambdas' not in s: torch.save({**s, 'lr_lambdas': [None] * len(s['base_lrs'])}, p)" \
    "$runs/$1/stage2/$(basename "$checkpoint")/scheduler.pt"
}
train() {  # name, extra flags: two runs at a time, one thread each
  seed "$1"
  python examples/train_hmt.py examples/train_args_books_cpu.json --output_dir "$runs/$1" --max_steps "$steps" \
    --resume_from_checkpoint last ${MEMORY_LR:+--memory_learning_rate "$MEMORY_LR"} "${@:2}" > "$runs/$1.log" 2>&1
}
mkdir -p "$runs"
# `wait PID` returns that run's status, so the script stops if a run fails.
train hmt --method hmt ${HMT_FLAGS:-} & first=$!; train rmt --method rmt & second=$!; wait $first; wait $second
# L=1024 chunks: one segment per window, as many tokens per stage as the L=256 runs (stage 1: 30 x 1,024 = 60 x 512).
train chunked --method chunked & first=$!
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
