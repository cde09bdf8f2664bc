#!/usr/bin/env bash
# examples/compare_books_cpu.sh at the 240-step budget of compare_books_cpu_long.sh, with the memory parameters
# trained at their own learning rate (MEMORY_LR, default 1e-3; the backbone keeps 5e-5). HMT and RMT train from
# scratch; the chunked baselines have no memory parameters to train, so their 240-step runs (runs/books-cpu-240,
# the same flags) are reused when present. Writes reports/books_cpu_memory_lr.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-runs/books-cpu-memory-lr}
mkdir -p "$runs"
for model in chunked chunked-1024; do
  [ -e "$runs/$model" ] || [ ! -e "runs/books-cpu-240/$model/stage2/train_results.json" ] \
    || ln -s "$PWD/runs/books-cpu-240/$model" "$runs/$model"
done
STEPS=240 MEMORY_LR=${MEMORY_LR:-1e-3} RUNS=$runs REPORT=${REPORT:-reports/books_cpu_memory_lr} \
  exec bash examples/compare_books_cpu.sh
