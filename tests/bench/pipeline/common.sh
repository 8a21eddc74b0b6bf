# Sourced by run.sh and bubble.sh: the settings and helpers both benches share.
# `bench` is bench_pipeline of the build directory given as $1.
bench="$1/bin/bench_pipeline"
steps=${GRADHUB_BENCH_STEPS:-20}
repeats=${GRADHUB_BENCH_REPEATS:-3}
# One BLAS thread per rank (Debian's OpenBLAS pool ignores at::set_num_threads; see ddp/run.sh).
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# Without it every rank of a data-parallel stage logs a c10 warning about the allocation
# counter's profiler hook (pipeline/allocation_counter.h).
export GLOG_minloglevel=${GLOG_minloglevel:-2}
# The median of a space-separated list on stdin.
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# The mean of a comma-separated list.
mean_of() { echo "$1" | tr ',' '\n' | awk '{s += $1} END {printf "%.6f", s / NR}'; }
