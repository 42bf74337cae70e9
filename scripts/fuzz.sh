#!/usr/bin/env bash
# Fuzzes kvroute's decoders of untrusted bytes (tests/fuzz/README.md) with
# libFuzzer under ASan+UBSan (clang from Debian). Builds only the fuzz targets
# and the decoders' sources, in their own build directory.
#
#   scripts/fuzz.sh [--inputs N] [--seconds S] [--build-dir DIR] [--seed N]
#                   [--fresh] [--build-only | --no-build] [TARGET...]
#
# Default: 10,000,000 inputs per target, every target, build dir build-fuzz,
# seed 1. --seconds alone: that long per target; with --inputs: whichever
# limit comes first. Before fuzzing, each target replays tests/fuzz/regressions/TARGET/.
# A crash (sanitizer report, broken contract check, timeout, out of memory)
# is saved as DIR/crashes/TARGET/crash-*; fuzzing then continues with the
# next seed until the inputs or seconds are used (at most 5 crashes a target).
# Prints one line per target (inputs run, crashes, exec/s) and ends with one
# JSON line. Exit status 1 if any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD

inputs="" seconds="" build_dir=build-fuzz seed=1 fresh=0 build=1 run=1 targets=()
while (($#)); do
  case "$1" in
    --inputs) inputs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --fresh) fresh=1; shift ;;
    --build-only) run=0; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done

[ -n "$inputs$seconds" ] || inputs=10000000
CXX_FUZZ=${CXX_FUZZ:-clang++-14}
if ((build)); then
  command -v "$CXX_FUZZ" >/dev/null || { echo "fuzz.sh: $CXX_FUZZ missing (scripts/setup.sh installs clang-14)" >&2; exit 2; }
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # -O1 -g and no NDEBUG: asserts stay on while fuzzing.
  cmake -S "$SRC" -B "$build_dir" -G Ninja -DKVROUTE_FUZZ=ON -DCMAKE_CXX_COMPILER="$CXX_FUZZ" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" "${launcher[@]}" >/dev/null
  start=$(date +%s)
  nice cmake --build "$build_dir" -j2 --target kvroute_fuzz_all
  echo "fuzz.sh: sanitizer build of the fuzz targets took $(($(date +%s) - start)) s"
fi
((run)) || exit 0

bin_dir=$build_dir/tests/fuzz
if ((${#targets[@]} == 0)); then
  for b in "$bin_dir"/kvroute_fuzz_*; do [ -x "$b" ] && targets+=("${b##*/kvroute_fuzz_}"); done
fi
((${#targets[@]})) || { echo "fuzz.sh: no fuzz targets in $bin_dir (build first)" >&2; exit 2; }

# Number of inputs a libFuzzer log says were run: the final stats when the run
# ended normally, else the last status line (a crash ends a run early).
runs_in_log() {
  local n
  n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$1" | tail -1)
  [ -n "$n" ] || n=$(grep -o '^#[0-9]*' "$1" | tail -1 | tr -d '#')
  echo "${n:-0}"
}

json_targets=() total_crashes=0
for t in "${targets[@]}"; do
  bin=$bin_dir/kvroute_fuzz_$t
  [ -x "$bin" ] || { echo "fuzz.sh: no target $t ($bin)" >&2; exit 2; }
  corpus=$build_dir/corpus/$t crashes_dir=$build_dir/crashes/$t logs=$build_dir/logs/$t
  ((fresh)) && rm -rf "$corpus"
  mkdir -p "$crashes_dir" "$logs"
  crashes=0
  regressions=("$SRC"/tests/fuzz/regressions/"$t"/*)
  nreg=0
  if [ -e "${regressions[0]}" ]; then
    nreg=${#regressions[@]}
    if ! "$bin" "${regressions[@]}" >"$logs/regressions.log" 2>&1; then
      echo "$t: a regression input fails again (log $logs/regressions.log):"; tail -30 "$logs/regressions.log"
      crashes=$((crashes + 1))
    fi
  fi
  # Per-target libFuzzer options: tests/fuzz/options/TARGET.dict (keywords) and
  # TARGET.flags (extra flags, e.g. a smaller -max_len for the slow YAML parser).
  opts=()
  [ -f "$SRC/tests/fuzz/options/$t.dict" ] && opts+=(-dict="$SRC/tests/fuzz/options/$t.dict")
  [ -f "$SRC/tests/fuzz/options/$t.flags" ] && read -r -a extra <"$SRC/tests/fuzz/options/$t.flags" && opts+=("${extra[@]}")
  # TARGET.asan: extra ASAN_OPTIONS (tests/fuzz/README.md: config's malloc_context_size).
  asan=${ASAN_OPTIONS:-}
  [ -f "$SRC/tests/fuzz/options/$t.asan" ] && asan+=${asan:+:}$(<"$SRC/tests/fuzz/options/$t.asan")
  done_runs=0 round=0 t0=$(date +%s.%N)
  while :; do
    budget=()
    if [ -n "$seconds" ]; then
      left=$(awk -v s="$seconds" -v t0="$t0" -v now="$(date +%s.%N)" 'BEGIN { x = int(s - (now - t0)); print x }')
      ((left > 0)) || break
      budget+=(-max_total_time="$left")
    fi
    if [ -n "$inputs" ]; then
      ((done_runs < inputs)) || break
      budget+=(-runs=$((inputs - done_runs)))
    fi
    log=$logs/run-$round.log
    rc=0
    ASAN_OPTIONS=$asan "$bin" "$corpus" -seed=$((seed + round)) "${budget[@]}" "${opts[@]}" -print_final_stats=1 -timeout=10 \
      -rss_limit_mb=2048 -artifact_prefix="$crashes_dir/" >"$log" 2>&1 || rc=$?
    n=$(runs_in_log "$log")
    done_runs=$((done_runs + n))
    round=$((round + 1))
    if ((rc != 0)); then
      crashes=$((crashes + 1))
      echo "$t: crash (exit $rc) after $n inputs; log $log:"
      grep -E 'ERROR|FUZZ_CHECK|runtime error|SUMMARY|Test unit written|#[0-9]+ 0x' "$log" | head -25
      ((crashes < 5)) || break
    fi
  done
  elapsed=$(awk -v t0="$t0" -v now="$(date +%s.%N)" 'BEGIN { printf "%.1f", now - t0 }')
  eps=$(awk -v n="$done_runs" -v s="$elapsed" 'BEGIN { printf "%d", (s > 0 ? n / s : 0) }')
  ncorpus=$(find "$corpus" -type f | wc -l)
  printf '%-16s %12d inputs  %d crashes  %8d exec/s  %7.1f s  corpus %d  regressions %d\n' \
    "$t" "$done_runs" "$crashes" "$eps" "$elapsed" "$ncorpus" "$nreg"
  json_targets+=("{\"target\":\"$t\",\"inputs\":$done_runs,\"crashes\":$crashes,\"exec_per_s\":$eps,\"seconds\":$elapsed,\"corpus\":$ncorpus,\"regressions\":$nreg}")
  total_crashes=$((total_crashes + crashes))
done

mode="\"inputs_limit\":${inputs:-null},\"seconds_limit\":${seconds:-null}"
joined=$(IFS=,; echo "${json_targets[*]}")
echo "{\"fuzzer\":\"libFuzzer\",\"sanitizers\":\"address,undefined\",$mode,\"seed\":$seed,\"targets\":[$joined],\"crashes\":$total_crashes}"
((total_crashes == 0))
