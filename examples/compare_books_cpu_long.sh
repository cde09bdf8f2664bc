#!/usr/bin/env bash
# examples/compare_books_cpu.sh with twice the stage-2 budget: 240 steps (245,760 tokens) instead of 120, for all four
# models alike, each continuing its 120-step run (runs/books-cpu) from step 120. Writes reports/books_cpu_240.
STEPS=240 CONTINUE_FROM=${CONTINUE_FROM:-runs/books-cpu} RUNS=${RUNS:-runs/books-cpu-240} \
  REPORT=${REPORT:-reports/books_cpu_240} exec bash "$(dirname "$0")/compare_books_cpu.sh"
