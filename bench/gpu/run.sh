#!/usr/bin/env bash
# GPU checks and measurements of symm on a machine with a GPU but no Rust toolchain.
#
# Build the bundle on a machine with Rust (`cargo xtask gpu-bundle`), carry it together with
# the checkout, then, from the repository root on the GPU machine:
#
#   bench/gpu/run.sh <part> [bundle]     bundle: default target/gpu-bundle/symm-gpu.tar.xz
#
# parts:
#   env       GPU, driver and CUDA versions, tools; written first into every log folder
#   tests     the GPU test set (tests/tests/gpu_collectives/), each test in its own process,
#             once per SYMM_ALGO in $ALGOS, with SYMM_BACKEND=cuda
#   nextest   the same set as GPU runners run it: `cargo nextest run --profile gpu
#             --run-ignored only` from the nextest archive and cargo-nextest binary that
#             `cargo xtask gpu-bundle` writes beside the bundle (gpu-tests.tar.zst,
#             cargo-nextest.xz; carry them too), once per SYMM_ALGO in $ALGOS
#   examples  the C examples (group-driven, pthreads, one process per rank), rebuilt with `make CUDA=1` against
#             the bundle's libsymm.so, on the cuda backend
#   perf      symm-perf sweeps: $OPS x $RANKS ranks on the one GPU x $DTYPES, 8 B to $MAX_BYTES
#   baseline  bench/torch_baseline.py over the same matrix as perf
#   clc       symm-perf clc (fixed grid vs work stealing, every imbalance and policy)
#   python    the Python package on the GPU (PyTorch tensors over symmetric memory, every
#             collective) and Triton kernels calling the device functions, 2 and 4 ranks:
#             bench/gpu/python_check.py, examples/triton/allreduce.py, examples/python/allreduce.py
#   torch-symm  symm on PyTorch's own symmetric tensors, 2 processes on the one GPU
#             (TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1): bench/gpu/torch_symm.py check (symm's
#             collectives on a symm_mem.empty tensor adopted with symm.torch.adopt, then
#             PyTorch's own barrier and one_shot_all_reduce on it), then bench (symm's
#             all-reduce against PyTorch's one_shot_all_reduce and two_shot_all_reduce_, same
#             tensor, CUDA-graph timed, $TORCH_SYMM_DTYPES, 1 KiB to 64 MiB; a Markdown table)
#   device    the CUDA C++ device API (examples/cuda): libsymm_device.a rebuilt from the bundle's
#             device-lib/symm_device.ptx with this machine's nvcc, device_allreduce linked with
#             -rdc=true -lsymm_device, jit_link linking kernel.ptx at run time (cuLink*) with
#             the archive, the object (their SASS) and the PTX (JIT-compiled)
#   blocks    the all-reduce's time against its grid (SYMM_MIN_BLOCKS = SYMM_MAX_BLOCKS = each
#             of $BLOCKS), one-shot and two-shot, 16 KiB..4 MiB, 8 and 2 ranks
#   probes    bench/gpu/floor_probe.cu (the floor of a small all-reduce: a graph of one launch,
#             empty or one flag round, as symm-perf times it) and bench/gpu/host_read_probe.cu
#             (a pinned host read from 1..128 blocks at once)
#   profile   the probes, then Nsight Compute (ncu) on two-shot 64 KiB, one-shot 16 KiB and LL 16 KiB, 8 ranks
#   all       env, tests, examples, device, perf, baseline, clc, python, torch-symm, in that order
#   quick     what fits one short GPU lease (about 8 minutes; 6.2 on an H100 with the shipped
#             SASS and a 40 s device step): env; the two probes; the GPU tests but the
#             dtype/op sweeps (auto); all_reduce on 8 and 2 ranks, float and bfloat16, 8 B to
#             64 MiB; the LL all-reduce forced from 64 B to 16 KiB on 2, 4 and 8 ranks;
#             examples;
#             device; python on 2 ranks; then the sweeps with the time left (the tests
#             through nextest where its files are beside the bundle)
#
# Every command runs under `timeout`, and each part stops starting new commands once its
# deadline ($DEADLINE_S seconds after the part began) is near: what did not run is recorded as
# "skipped". A failing command is recorded and the part goes on. Logs, one file per command,
# plus results.tsv and summary.txt, go to bench/gpu/logs/<date>; when $OUT is set (a folder
# that should receive few files) they are written elsewhere and $OUT gets summary.txt,
# results.tsv and logs.tar.gz holding them all. The exit status is 0 only when everything that
# was to run passed.
#
# Settings (environment, defaults in brackets):
#   DEADLINE_S [500]  per part          SYMM_TIMEOUT_MS [5000]  bound of every wait on a peer
#   ALGOS [auto ll oneshot twoshot pat]   TESTS [.]  extended regex selecting GPU tests by name
#   SKIP_TESTS [none]  extended regex of GPU tests left out
#   NEXTEST_FILTER [none]  nextest filterset narrowing part nextest, e.g. 'not test(/every_dtype/)'
#   NEXTEST_TIMEOUT_S [400]  one `cargo nextest run` (one algorithm)
#   TEST_TIMEOUT_S [150]                EXAMPLE_TIMEOUT_S [120]
#   OPS [all_reduce all_gather reduce_scatter]   RANKS [2 4 8]   DTYPES [float bfloat16]
#   MIN_BYTES [8]  MAX_BYTES [64M]  ITERS [20]  WARMUP [5]  CHECK [1]  PERF_TIMEOUT_S [120]
#   BASELINE_TIMEOUT_S [120]            CLC_ARGS [-t 4096 -i all -p all -n 10]
#   CLC_TIMEOUT_S [300]                 CUDA_HOME [/usr/local/cuda, else from nvcc]
#   PYTHON_TIMEOUT_S [400]              PYTHON_RANKS [2 4]
#   TORCH_SYMM_TIMEOUT_S [240]          TORCH_SYMM_DTYPES [float32 bfloat16]
#   BLOCKS [1 2 4 8 16 32]  the grids of part blocks
#   KEEP_SCRATCH [0]  1: keep the extracted bundle (its path is printed)
#   QUICK_SWEEPS_S [150]  quick: the deadline of its last step, the dtype/op sweeps
#   BACKEND [cuda]    SYMM_BACKEND of every run; host: try the script where there is no GPU
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

[ $# -ge 1 ] || usage
PART=$1
case "$PART" in
  env | tests | nextest | examples | device | perf | baseline | clc | python | torch-symm | blocks | probes | profile | all | quick) ;;
  *) usage ;;
esac

# Resolve the bundle against the caller's directory, then work from the repository root.
BUNDLE_ARG=${2:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ -n "$BUNDLE_ARG" ]; then
  BUNDLE=$BUNDLE_ARG
  if [ -d "$(dirname "$BUNDLE_ARG")" ]; then
    BUNDLE=$(cd "$(dirname "$BUNDLE_ARG")" && pwd)/$(basename "$BUNDLE_ARG")
  fi
else
  BUNDLE=$ROOT/target/gpu-bundle/symm-gpu.tar.xz
fi
cd "$ROOT"

DEADLINE_S=${DEADLINE_S:-500}
export SYMM_TIMEOUT_MS=${SYMM_TIMEOUT_MS:-5000}
ALGOS=${ALGOS:-auto ll oneshot twoshot pat}
TESTS=${TESTS:-.}
SKIP_TESTS=${SKIP_TESTS:-}
NEXTEST_FILTER=${NEXTEST_FILTER:-}
NEXTEST_TIMEOUT_S=${NEXTEST_TIMEOUT_S:-400}
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-150}
EXAMPLE_TIMEOUT_S=${EXAMPLE_TIMEOUT_S:-120}
OPS=${OPS:-all_reduce all_gather reduce_scatter}
RANKS=${RANKS:-2 4 8}
DTYPES=${DTYPES:-float bfloat16}
MIN_BYTES=${MIN_BYTES:-8}
MAX_BYTES=${MAX_BYTES:-64M}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
CHECK=${CHECK:-1}
PERF_TIMEOUT_S=${PERF_TIMEOUT_S:-120}
BASELINE_TIMEOUT_S=${BASELINE_TIMEOUT_S:-120}
CLC_ARGS=${CLC_ARGS:--t 4096 -i all -p all -n 10}
CLC_TIMEOUT_S=${CLC_TIMEOUT_S:-300}
PYTHON_TIMEOUT_S=${PYTHON_TIMEOUT_S:-400}
PYTHON_RANKS=${PYTHON_RANKS:-2 4}
TORCH_SYMM_TIMEOUT_S=${TORCH_SYMM_TIMEOUT_S:-240}
TORCH_SYMM_DTYPES=${TORCH_SYMM_DTYPES:-float32 bfloat16}
KEEP_SCRATCH=${KEEP_SCRATCH:-0}
BACKEND=${BACKEND:-cuda}
# Kernels are JIT-compiled from PTX on first use; keep them all in the driver's cache.
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}

if [ ! -f "$BUNDLE" ]; then
  echo "no bundle at $BUNDLE: build it with \`cargo xtask gpu-bundle\` and carry it" >&2
  exit 2
fi
if [ -n "${OUT:-}" ]; then
  LOG=$(mktemp -d "${TMPDIR:-/tmp}/symm-gpu-logs.XXXXXX")/logs
else
  LOG=$ROOT/bench/gpu/logs/$(date +%Y%m%d-%H%M%S)
fi
mkdir -p "$LOG"
RESULTS=$LOG/results.tsv
[ -f "$RESULTS" ] || printf 'part\titem\tvariant\tresult\tseconds\n' >"$RESULTS"
FAILED=0

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# record PART ITEM VARIANT RESULT SECONDS
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RESULTS"
  printf '  %-8s %-58s %-10s %-8s %6ss\n' "$@"
  [ "$4" = pass ] || FAILED=$((FAILED + 1))
}

# A log file name for a command line: anything but letters, digits, '.', '-' becomes '_' (an
# argument that is a path must not make folders).
log_name() { printf '%s' "$1" | tr -c 'A-Za-z0-9.-' '_'; }

# The part's deadline, in $SECONDS.
start_part() {
  PART_END=$((SECONDS + DEADLINE_S))
  echo "== $1 (deadline ${DEADLINE_S} s, logs in $LOG)"
}

# Seconds a command may take: min(limit, time left in the part); 0 when under 10 s are left.
budget() {
  local left=$((PART_END - SECONDS))
  if [ "$left" -lt 10 ]; then
    echo 0
  elif [ "$1" -lt "$left" ]; then
    echo "$1"
  else
    echo "$left"
  fi
}

# run_logged PART ITEM VARIANT LIMIT LOGFILE EXPECT COMMAND...: run COMMAND under timeout with
# its output in LOGFILE, and record the result. pass: exit status 0 and, when EXPECT is not
# empty, EXPECT (a fixed string) in the output, or, for EXPECT "!TEXT", TEXT nowhere in it;
# timeout: killed by timeout; fail: otherwise.
run_logged() {
  local part=$1 item=$2 variant=$3 limit=$4 logfile=$5 expect=$6
  shift 6
  local t
  t=$(budget "$limit")
  if [ "$t" -eq 0 ]; then
    record "$part" "$item" "$variant" skipped 0
    return 0
  fi
  mkdir -p "$(dirname "$logfile")"
  local start rc=0
  start=$(now)
  {
    echo "\$ $*"
    echo "# limit ${t} s, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  } >"$logfile"
  timeout -k 10 "$t" "$@" </dev/null >>"$logfile" 2>&1 || rc=$?
  local secs result=pass
  secs=$(elapsed "$start")
  echo "# exit status $rc after $secs s" >>"$logfile"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    result=timeout
  elif [ "$rc" -ne 0 ]; then
    result=fail
  elif [ "${expect#!}" != "$expect" ]; then
    if grep -qF -- "${expect#!}" "$logfile"; then
      result=fail
      echo "# fail: the output contains \"${expect#!}\"" >>"$logfile"
    fi
  elif [ -n "$expect" ] && ! grep -qF -- "$expect" "$logfile"; then
    result=fail
    echo "# fail: the output lacks \"$expect\"" >>"$logfile"
  fi
  record "$part" "$item" "$variant" "$result" "$secs"
}

write_env() {
  {
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# kernel: $(uname -srm)"
    echo "# bundle: $BUNDLE"
    if command -v nvidia-smi >/dev/null; then
      echo "## nvidia-smi --query-gpu"
      nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
        --format=csv || true
      echo "## nvidia-smi"
      nvidia-smi || true
      echo "## nvidia-smi topo -m"
      nvidia-smi topo -m || true
    else
      echo "## nvidia-smi: not found"
    fi
    echo "## CUDA"
    if command -v nvcc >/dev/null; then nvcc --version | tail -n 2; else echo "nvcc: not found"; fi
    echo "CUDA_HOME: ${CUDA_HOME:-unset}"
    echo "## compilers and python"
    { cc --version 2>/dev/null | sed -n 1p; } || echo "cc: not found"
    { make --version 2>/dev/null | sed -n 1p; } || echo "make: not found"
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' 2>&1 || true
    python3 -c 'import triton; print("triton", triton.__version__)' 2>&1 || true
    if [ -f "$B/BUILD-INFO.txt" ]; then
      echo "## bundle BUILD-INFO.txt"
      cat "$B/BUILD-INFO.txt"
    fi
  } >"$LOG/env.txt" 2>&1
}

# ---- the bundle ------------------------------------------------------------------------------

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/symm-gpu.XXXXXX")
cleanup() {
  if [ -n "${OUT:-}" ] && [ -d "$LOG" ]; then
    mkdir -p "$OUT"
    cp -f "$LOG/summary.txt" "$LOG/results.tsv" "$OUT/" 2>/dev/null || true
    tar -czf "$OUT/logs.tar.gz" -C "$(dirname "$LOG")" "$(basename "$LOG")" || true
  fi
  if [ "$KEEP_SCRATCH" = 1 ]; then echo "scratch kept: $SCRATCH"; else rm -rf "$SCRATCH"; fi
}
trap cleanup EXIT
if command -v xz >/dev/null; then
  tar -xJf "$BUNDLE" -C "$SCRATCH"
else
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE" "$SCRATCH"
fi
B=$SCRATCH/symm-gpu
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

if [ -z "${CUDA_HOME:-}" ]; then
  if [ -f /usr/local/cuda/include/cuda.h ]; then
    CUDA_HOME=/usr/local/cuda
  elif command -v nvcc >/dev/null; then
    CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
  fi
fi
write_env

# ---- parts -----------------------------------------------------------------------------------

part_env() {
  cat "$LOG/env.txt"
}

part_tests() {
  start_part tests
  local names
  names=$("$B/bin/gpu_collectives" --list --ignored 2>/dev/null | sed -n 's/: test$//p' | grep -E -- "$TESTS" || true)
  if [ -n "$SKIP_TESTS" ]; then
    names=$(echo "$names" | grep -vE -- "$SKIP_TESTS" || true)
  fi
  if [ -z "$names" ]; then
    record tests "(listing the GPU tests)" - fail 0
    return 0
  fi
  echo "$names" >"$LOG/tests-list.txt"
  printf '  %-8s %-58s %-10s %-8s %7s\n' part test algo result seconds
  local algo name
  for algo in $ALGOS; do
    for name in $names; do
      # A name that matched nothing also exits 0: insist that exactly one test passed.
      SYMM_BACKEND=$BACKEND SYMM_ALGO=$algo run_logged tests "$name" "$algo" "$TEST_TIMEOUT_S" \
        "$LOG/tests/$algo/$name.log" "test result: ok. 1 passed" \
        "$B/bin/gpu_collectives" --ignored --exact "$name" --test-threads=1 --nocapture
    done
  done
  # The Rust example's kernels (the typed device API: frames, the tile scheduler, the in-kernel
  # all-reduce), launched from their PTX through the Rust API; once, with the default algorithm.
  if [ -x "$B/bin/example_kernels" ]; then
    SYMM_BACKEND=$BACKEND run_logged tests "rust example: on_a_gpu_*" auto "$TEST_TIMEOUT_S" \
      "$LOG/tests/example_kernels.log" "test result: ok. 2 passed" \
      "$B/bin/example_kernels" --ignored --test-threads=1 --nocapture
  fi
}

# The nextest files `cargo xtask gpu-bundle` writes beside the bundle.
NEXTEST_ARCHIVE=$(dirname "$BUNDLE")/gpu-tests.tar.zst
NEXTEST_PACKED=$(dirname "$BUNDLE")/cargo-nextest.xz
have_nextest() { [ -f "$NEXTEST_ARCHIVE" ] && [ -f "$NEXTEST_PACKED" ]; }

part_nextest() {
  start_part nextest
  if ! have_nextest; then
    record nextest "(gpu-tests.tar.zst, cargo-nextest.xz)" "not found" fail 0
    return 0
  fi
  local nextest=$SCRATCH/cargo-nextest
  if command -v xz >/dev/null; then
    xz -dc "$NEXTEST_PACKED" >"$nextest"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$NEXTEST_PACKED" "$nextest"
  fi
  chmod +x "$nextest"
  local filter=() algo
  [ -z "$NEXTEST_FILTER" ] || filter=(-E "$NEXTEST_FILTER")
  for algo in $ALGOS; do
    # The gpu profile: one test at a time, each in its own process, no retries.
    SYMM_BACKEND=$BACKEND SYMM_ALGO=$algo run_logged nextest \
      "cargo nextest run --profile gpu ${NEXTEST_FILTER:+-E '$NEXTEST_FILTER'}" "$algo" \
      "$NEXTEST_TIMEOUT_S" "$LOG/nextest/$algo.log" "" \
      "$nextest" nextest run --archive-file "$NEXTEST_ARCHIVE" --workspace-remap "$ROOT" \
      --profile gpu --run-ignored only --no-fail-fast ${filter[@]+"${filter[@]}"}
    grep -E '^ *(Summary|FAIL|TIMEOUT|SIGSEGV|SIGABRT) ' "$LOG/nextest/$algo.log" | sed 's/^ */    /' || true
  done
}

part_examples() {
  start_part examples
  # The bundle's examples were built without the CUDA toolkit: they fill buffers on the host
  # backend only. Rebuild them with CUDA=1 (device buffers filled through the driver) against
  # the bundle's libsymm.so, in a copy, so that a failed build leaves those.
  local dir=$B/examples/c
  if [ -n "${CUDA_HOME:-}" ] && [ -f "$CUDA_HOME/include/cuda.h" ]; then
    cp -R "$B/examples/c" "$B/examples/c-cuda"
    run_logged examples "make CUDA=1" "$CUDA_HOME" 120 "$LOG/examples/build.log" "" \
      make -C "$B/examples/c-cuda" clean all CUDA=1 CUDA_HOME="$CUDA_HOME" \
      LIBSYMM="$B/lib/libsymm.so" LDFLAGS="-Wl,-rpath,$B/lib"
    if tail -n 1 "$RESULTS" | grep -q $'\tpass\t'; then
      dir=$B/examples/c-cuda
    else
      echo "  (the CUDA=1 build failed: running the bundle's host-only builds)"
    fi
  else
    record examples "make CUDA=1" "no cuda.h" fail 0
    echo "  (no CUDA toolkit found: running the bundle's host-only builds)"
  fi
  local args
  while read -r prog args; do
    # shellcheck disable=SC2086 # $args: the example's arguments
    SYMM_BACKEND=$BACKEND run_logged examples "$prog $args" "$BACKEND" "$EXAMPLE_TIMEOUT_S" \
      "$LOG/examples/$(log_name "$prog $args").log" "result check: OK" "$dir/$prog" $args
  done <<'EOF'
allreduce_pthreads 2
allreduce_pthreads 4
allreduce_pthreads 5 4099
allreduce_pthreads 8 1048576
allreduce 8
allreduce 1 7
allreduce 3 1023
allreduce 8 1048576 20
allreduce_mp 2
allreduce_mp 4
broadcast 8
broadcast 3 4099
EOF
}

part_perf() {
  start_part perf
  local op g d
  for op in $OPS; do
    for g in $RANKS; do
      for d in $DTYPES; do
        SYMM_BACKEND=$BACKEND run_logged perf "$op -g $g -d $d" "8..$MAX_BYTES" "$PERF_TIMEOUT_S" \
          "$LOG/perf/${op}_g${g}_${d}.log" "" \
          "$B/bin/symm-perf" "$op" -b "$MIN_BYTES" -e "$MAX_BYTES" -f 2 -g "$g" -d "$d" -o sum \
          -n "$ITERS" -w "$WARMUP" -c "$CHECK"
      done
    done
  done
}

part_perf_procs() {
  # One process per rank (processes time-slice one GPU: a correctness run; its times are not
  # comparable with the one-process runs).
  local g
  for g in 2 4; do
    SYMM_BACKEND=$BACKEND run_logged perf "all_reduce --procs $g -d float" "8..$MAX_BYTES" \
      "$PERF_TIMEOUT_S" "$LOG/perf/all_reduce_procs${g}_float.log" "" \
      "$B/bin/symm-perf" all_reduce -b "$MIN_BYTES" -e "$MAX_BYTES" -f 2 --procs "$g" -d float \
      -o sum -n "$ITERS" -w "$WARMUP" -c "$CHECK"
  done
}

part_perf_staged() {
  # Buffers in the process's own memory (-R 0): every call staged through the staging
  # window, next to the same sizes in windows (the -g runs above), for the staged/unstaged
  # ratio per size.
  local op
  for op in all_reduce all_gather; do
    SYMM_BACKEND=$BACKEND run_logged perf "$op -g 4 -d float -R 0" "1K..64M" \
      "$PERF_TIMEOUT_S" "$LOG/perf/${op}_g4_float_staged.log" "" \
      "$B/bin/symm-perf" "$op" -b 1K -e 64M -f 4 -g 4 -d float -o sum -R 0 \
      -n "$ITERS" -w "$WARMUP" -c "$CHECK"
  done
}

part_baseline() {
  start_part baseline
  local op g d
  for op in $OPS; do
    for g in $RANKS; do
      for d in $DTYPES; do
        run_logged baseline "$op -g $g -d $d" "8..$MAX_BYTES" "$BASELINE_TIMEOUT_S" \
          "$LOG/baseline/${op}_g${g}_${d}.log" "!WRONG" \
          python3 "$B/bench/torch_baseline.py" "$op" -g "$g" -b "$MIN_BYTES" -e "$MAX_BYTES" \
          -f 2 -d "$d" -n "$ITERS" -w "$WARMUP"
      done
    done
  done
}

part_clc() {
  start_part clc
  # shellcheck disable=SC2086 # $CLC_ARGS: symm-perf clc's options
  SYMM_BACKEND=$BACKEND run_logged clc "symm-perf clc $CLC_ARGS" "$BACKEND" "$CLC_TIMEOUT_S" \
    "$LOG/clc/clc.log" "" "$B/bin/symm-perf" clc $CLC_ARGS
}

# The all-reduce's time against its grid: SYMM_MIN_BLOCKS = SYMM_MAX_BLOCKS = each of $BLOCKS,
# one-shot and two-shot forced, 16 KiB..4 MiB, on 8 and 2 ranks (what the cost model's
# per-block terms are fitted to).
part_blocks() {
  start_part blocks
  local algo g b
  for algo in oneshot twoshot; do
    for g in 8 2; do
      for b in ${BLOCKS:-1 2 4 8 16 32}; do
        SYMM_BACKEND=$BACKEND SYMM_ALGO=$algo SYMM_MIN_BLOCKS=$b SYMM_MAX_BLOCKS=$b \
          run_logged blocks "all_reduce SYMM_ALGO=$algo -g $g, $b blocks" "16K..4M" \
          "$PERF_TIMEOUT_S" "$LOG/blocks/${algo}_g${g}_b${b}.log" "" \
          "$B/bin/symm-perf" all_reduce -b 16K -e 4M -f 4 -g "$g" -d float -o sum \
          -n "$ITERS" -w "$WARMUP" -c 0
      done
    done
  done
}

# Two probes, built here with nvcc: what a read of pinned host memory costs when many blocks
# make it at once (same word, or a line per block: bench/gpu/host_read_probe.cu), and the floor
# of a small all-reduce as symm-perf times it (a graph of one launch, empty or one flag round
# among its blocks, with and without the event record: bench/gpu/floor_probe.cu).
part_probes() {
  start_part probes
  if ! command -v nvcc >/dev/null; then
    record probes "nvcc" "not found" fail 0
    return 0
  fi
  local arch name probe
  arch=sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ' || true)
  [ "$arch" != sm_ ] || arch=sm_90
  for name in floor_probe host_read_probe; do
    probe=$SCRATCH/$name
    run_logged probes "nvcc $name.cu" "$arch" 120 "$LOG/probes/$name-build.log" "" \
      nvcc -O2 -arch="$arch" "$ROOT/bench/gpu/$name.cu" -o "$probe"
    [ -x "$probe" ] || continue
    run_logged probes "$name" "$arch" 60 "$LOG/probes/$name.log" "" "$probe"
  done
}

# Nsight Compute on the mid-size all-reduces (one eager launch each, every rank in it):
# two-shot 64 KiB and one-shot 16 KiB on 8 ranks, LL 16 KiB for comparison.
part_profile() {
  part_probes
  start_part profile
  if ! command -v ncu >/dev/null; then
    record profile "ncu" "not found" fail 0
    return 0
  fi
  local algo bytes
  while read -r algo bytes; do
    SYMM_BACKEND=$BACKEND SYMM_ALGO=$algo run_logged profile "ncu $algo $bytes -g 8" ncu \
      "$PERF_TIMEOUT_S" "$LOG/profile/${algo}_${bytes}.log" "" \
      ncu --target-processes all -k regex:symm_ -c 3 --section SpeedOfLight \
      --section LaunchStats --section Occupancy --section WarpStateStats \
      --section MemoryWorkloadAnalysis \
      "$B/bin/symm-perf" all_reduce -b "$bytes" -e "$bytes" -g 8 -d float -o sum -n 1 -w 1 \
      -G 0 -c 0
  done <<LIST
twoshot 64K
oneshot 16K
ll 16K
LIST
}

part_python() {
  start_part python
  # The package laid out as pip installs it: the sources plus symm/lib/ holding the bundle's
  # libsymm.so, symm.h and the Triton libraries (no Rust, no network needed).
  local pkg=$B/python g
  mkdir -p "$pkg/symm/lib"
  cp "$B/lib/libsymm.so" "$B/ffi-headers/symm.h" "$B"/ptx-out/symm_triton*.ll "$pkg/symm/lib/"
  export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$SCRATCH/triton-cache}
  # shellcheck disable=SC2086 # $PYTHON_RANKS: rank counts
  PYTHONPATH=$pkg SYMM_BACKEND=$BACKEND run_logged python "python_check.py --ranks ${PYTHON_RANKS// /,}" \
    "$BACKEND" "$PYTHON_TIMEOUT_S" "$LOG/python/check.log" "0 failed" \
    python3 "$B/bench/gpu/python_check.py" --ranks $PYTHON_RANKS
  for g in $PYTHON_RANKS; do
    PYTHONPATH=$pkg SYMM_BACKEND=$BACKEND run_logged python "examples/triton/allreduce.py --ranks $g" \
      "$BACKEND" 120 "$LOG/python/triton_allreduce_$g.log" "everywhere" \
      python3 "$B/examples/triton/allreduce.py" --ranks "$g"
  done
  PYTHONPATH=$pkg SYMM_BACKEND=$BACKEND run_logged python "examples/python/allreduce.py" "$BACKEND" 120 \
    "$LOG/python/python_allreduce.log" "all-reduce of" python3 "$B/examples/python/allreduce.py"
  # Tensors from symm.torch.mem_pool (symmMemAlloc under torch's caching allocator) on CUDA,
  # rendezvous and every collective on them without a copy: python/tests/test_torch_windows.py's
  # CUDA case, run without pytest. Two processes share the GPU when there is one.
  PYTHONPATH=$pkg SYMM_BACKEND=$BACKEND SYMM_DEBUG=INFO OMP_NUM_THREADS=1 run_logged python \
    "torchrun 2 x torch_windows_worker.py --cuda" "$BACKEND" 180 "$LOG/python/torch_windows_cuda.log" \
    "checks OK" python3 -m torch.distributed.run --nproc-per-node=2 --master-port=29517 \
    "$B/python/tests/torch_windows_worker.py" --cuda
}

part_torch_symm() {
  start_part torch-symm
  local pkg=$B/python dtype port=29531
  mkdir -p "$pkg/symm/lib"
  cp "$B/lib/libsymm.so" "$B/ffi-headers/symm.h" "$B"/ptx-out/symm_triton*.ll "$pkg/symm/lib/"
  PYTHONPATH=$pkg SYMM_BACKEND=$BACKEND OMP_NUM_THREADS=1 TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 \
    run_logged torch-symm "torchrun 2 x torch_symm.py check" "$BACKEND" "$TORCH_SYMM_TIMEOUT_S" \
    "$LOG/torch-symm/check.log" "checks OK" python3 -m torch.distributed.run --nproc-per-node=2 \
    --master-port=$port "$B/bench/gpu/torch_symm.py" check
  for dtype in $TORCH_SYMM_DTYPES; do
    port=$((port + 1))
    PYTHONPATH=$pkg SYMM_BACKEND=$BACKEND OMP_NUM_THREADS=1 TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 \
      run_logged torch-symm "torchrun 2 x torch_symm.py bench" "$dtype" "$TORCH_SYMM_TIMEOUT_S" \
      "$LOG/torch-symm/bench_$dtype.log" "bench done" python3 -m torch.distributed.run --nproc-per-node=2 \
      --master-port=$port "$B/bench/gpu/torch_symm.py" bench --dtype "$dtype"
  done
}

summary() {
  {
    echo "# symm GPU run: $PART, $(date -u +%Y-%m-%dT%H:%M:%SZ), bundle $(basename "$BUNDLE")"
    grep -m 1 -A 2 '^## nvidia-smi --query-gpu' "$LOG/env.txt" | tail -n +2 || true
    awk -F '\t' 'NR == 1 { next }
      $1 != last { printf "\n%-8s %-58s %-10s %-18s %8s\n", "part", ($1 == "tests" ? "test" : "item"),
                   ($1 == "tests" ? "algo" : "variant"), "result", "seconds"; last = $1 }
      { printf "%-8s %-58s %-10s %-18s %8s\n", $1, $2, $3, $4, $5 }' "$RESULTS"
    echo
    awk -F '\t' 'NR > 1 { n[$4 == "pass" ? "pass" : "not passed"]++ }
      END { printf "passed %d, not passed %d\n", n["pass"], n["not passed"] }' "$RESULTS"
  } >"$LOG/summary.txt"
  echo
  cat "$LOG/summary.txt"
  echo "logs: $LOG"
}

part_device() {
  start_part device
  if ! command -v nvcc >/dev/null; then
    record device "nvcc" "not found" fail 0
    return 0
  fi
  local dir=$B/examples/cuda lib=$B/device-lib arch
  arch=sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ' || true)
  [ "$arch" != sm_ ] || arch=sm_90
  # The archive is rebuilt here: an object from a newer nvcc than this machine's nvlink may be
  # refused; the PTX (ISA 7.0) is accepted by every CUDA 12/13 toolkit.
  run_logged device "nvcc -dc symm_device.ptx" "$arch" 120 "$LOG/device/lib.log" "" \
    bash -c "nvcc -dc -arch=$arch '$lib/symm_device.ptx' -o '$lib/symm_device.o' && rm -f '$lib/libsymm_device.a' && nvcc -lib '$lib/symm_device.o' -o '$lib/libsymm_device.a'"
  run_logged device "make examples/cuda" "$arch" 180 "$LOG/device/build.log" "" \
    make -C "$dir" clean all NVCC=nvcc ARCH="$arch" DEVICE_LIB="$lib" LIBSYMM="$B/lib/libsymm.a" \
    CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" CUDA_LIB="${CUDA_HOME:-/usr/local/cuda}/lib64/stubs"
  local prog args
  while read -r prog args; do
    # shellcheck disable=SC2086 # $args: the example's arguments
    SYMM_BACKEND=cuda run_logged device "$prog $args" cuda "$EXAMPLE_TIMEOUT_S" \
      "$LOG/device/$(log_name "$prog $args").log" "correct" "$dir/$prog" $args
  done <<LIST
device_allreduce 4
device_allreduce 1 7
device_allreduce 8 1048576
jit_link $dir/kernel.ptx $lib/libsymm_device.a 4
jit_link $dir/kernel.ptx $lib/symm_device.o 3 1023
jit_link $dir/kernel.ptx $lib/symm_device.ptx 4
LIST
}

# The LL all-reduce forced, 64 B to 16 KiB (its buffers' limit), on 2, 4 and 8 ranks.
part_perf_ll() {
  start_part perf-ll
  local g
  for g in 2 4 8; do
    SYMM_BACKEND=$BACKEND SYMM_ALGO=ll run_logged perf "all_reduce SYMM_ALGO=ll -g $g -d float" \
      "64..16K" "$PERF_TIMEOUT_S" "$LOG/perf/all_reduce_ll_g${g}_float.log" "" \
      "$B/bin/symm-perf" all_reduce -b 64 -e 16K -f 2 -g "$g" -d float -o sum \
      -n "$ITERS" -w "$WARMUP" -c "$CHECK"
  done
}

# One short lease, most telling first (see the usage text).
part_quick() {
  part_env
  # First: seconds, and they answer whether the start look's round trip was the mid-size cost.
  DEADLINE_S=60 part_probes
  if have_nextest; then
    NEXTEST_FILTER='not test(/every_dtype/)' DEADLINE_S=150 NEXTEST_TIMEOUT_S=140 ALGOS=auto part_nextest
  else
    SKIP_TESTS=${SKIP_TESTS:-every_dtype} DEADLINE_S=150 TEST_TIMEOUT_S=60 ALGOS=auto part_tests
  fi
  OPS=all_reduce RANKS="8 2" DEADLINE_S=150 PERF_TIMEOUT_S=60 ITERS=10 WARMUP=3 part_perf
  DEADLINE_S=40 PERF_TIMEOUT_S=20 ITERS=10 WARMUP=3 part_perf_ll
  DEADLINE_S=40 PERF_TIMEOUT_S=20 ITERS=10 WARMUP=3 part_perf_staged
  DEADLINE_S=30 EXAMPLE_TIMEOUT_S=20 part_examples
  # nvcc -dc of the device library takes about 35 s on an H100 machine; jit_link of the
  # archive and the object links that SASS (each prints its link time), the last jit_link
  # JIT-compiles the PTX again.
  DEADLINE_S=110 EXAMPLE_TIMEOUT_S=60 part_device
  DEADLINE_S=100 PYTHON_TIMEOUT_S=90 PYTHON_RANKS=2 part_python
  if have_nextest; then
    NEXTEST_FILTER='test(/every_dtype/)' DEADLINE_S=${QUICK_SWEEPS_S:-150} NEXTEST_TIMEOUT_S=150 ALGOS=auto part_nextest
  else
    TESTS=every_dtype SKIP_TESTS= DEADLINE_S=${QUICK_SWEEPS_S:-150} TEST_TIMEOUT_S=150 ALGOS=auto part_tests
  fi
}

case "$PART" in
  env) part_env ;;
  quick) part_quick ;;
  device) part_device ;;
  tests) part_tests ;;
  nextest) part_nextest ;;
  examples) part_examples ;;
  perf) part_perf; part_perf_procs; part_perf_staged ;;
  baseline) part_baseline ;;
  clc) part_clc ;;
  python) part_python ;;
  torch-symm) part_torch_symm ;;
  blocks) part_blocks ;;
  probes) part_probes ;;
  profile) part_profile ;;
  all)
    part_env
    part_tests
    part_examples
    part_device
    part_perf
    part_perf_procs
    part_perf_staged
    part_baseline
    part_clc
    part_python
    part_torch_symm
    ;;
esac
[ "$PART" = env ] || summary
if [ "$FAILED" -ne 0 ]; then
  echo "$FAILED item(s) did not pass" >&2
  exit 1
fi
