#!/usr/bin/env bash
# examples/compare_books_cpu_memory_lr.sh with HMT's memory embedding read as the mean final state over the segment's
# tokens (`--memory_readout segment_mean`) instead of at the trailing memory slot (Eq. 5). Only HMT trains: RMT reads
# its memory at the memory slot by definition, so its run (runs/books-cpu-memory-lr, same flags) is reused, as are
# the chunked 240-step runs (runs/books-cpu-240). Writes reports/books_cpu_segment_mean.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-runs/books-cpu-segment-mean}
mkdir -p "$runs"
for source in books-cpu-240/chunked books-cpu-240/chunked-1024 books-cpu-memory-lr/rmt; do
  model=$(basename "$source")
  [ -e "$runs/$model" ] || [ ! -e "runs/$source/stage2/train_results.json" ] || ln -s "$PWD/runs/$source" "$runs/$model"
done
HMT_FLAGS="--memory_readout segment_mean" STEPS=240 MEMORY_LR=${MEMORY_LR:-1e-3} RUNS=$runs \
  REPORT=${REPORT:-reports/books_cpu_segment_mean} exec bash examples/compare_books_cpu.sh
