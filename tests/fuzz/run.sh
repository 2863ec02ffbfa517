#!/usr/bin/env bash
# Fuzzes the safetensors header parser: tests/fuzz/run.sh SECONDS [libFuzzer flags...]
# then the peer manifest parser for MANIFEST_SECONDS (default 30; 0 skips it).
#
# Configures and builds build-fuzz with clang and -fsanitize=fuzzer,address,undefined
# (idempotent), seeds tests/fuzz/corpus-work/ from tests/fuzz/seeds/ (and from
# build/tl_make_corpus when it exists), runs tl_header_fuzz for SECONDS and prints a
# two-line summary. The full log is build-fuzz/fuzz.log; crashes, leaks, timeouts and
# out-of-memory inputs are written to build-fuzz/artifacts/. Exits non-zero on any
# finding or build failure.
#
# Limits: inputs up to MAX_LEN bytes (1 MiB); no single allocation over
# MALLOC_LIMIT_MB (32 MiB, i.e. 32x the largest input; the target itself also checks
# that every input's allocations stay within a small multiple of its own size); RSS
# 2 GiB; 30 s per input.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
secs=${1:?usage: tests/fuzz/run.sh SECONDS [libFuzzer flags...]}
shift
max_len=${MAX_LEN:-1048576}
malloc_limit_mb=${MALLOC_LIMIT_MB:-32}

build=$root/build-fuzz
fuzz_dir=$root/tests/fuzz
corpus=$fuzz_dir/corpus-work
log=$build/fuzz.log
mkdir -p "$build" "$build/artifacts" "$corpus"

# --- configure (again only when the settings change) and build ---------------------
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cfg=(-DCMAKE_BUILD_TYPE=RelWithDebInfo
     -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
     "-DCMAKE_CXX_FLAGS=$san"
     -DTENSORLIFT_BUILD_FUZZ=ON -DTENSORLIFT_BUILD_TESTS=OFF
     -DTENSORLIFT_BUILD_BENCH=OFF -DTENSORLIFT_BUILD_TOOLS=OFF -DTENSORLIFT_WITH_CUDA=OFF)
stamp=$(printf '%s\n' "${cfg[@]}")
if [ ! -f "$build/CMakeCache.txt" ] || [ "$(cat "$build/.configured" 2>/dev/null)" != "$stamp" ]; then
  cmake -S "$root" -B "$build" "${cfg[@]}" > "$build/cmake.log" 2>&1 \
    || { cat "$build/cmake.log"; echo "fuzz: configure failed" >&2; exit 1; }
  printf '%s' "$stamp" > "$build/.configured"
fi
cmake --build "$build" --target tl_header_fuzz tl_manifest_fuzz -j 2 > "$build/build.log" 2>&1 \
  || { grep -E 'error|warning' "$build/build.log" | head -40 || true; echo "fuzz: build failed (build-fuzz/build.log)" >&2; exit 1; }

# --- seed the work corpus (idempotent) ---------------------------------------------
for f in "$fuzz_dir"/seeds/*.safetensors; do
  [ -e "$f" ] && cp -n "$f" "$corpus/seed-$(basename "$f")"
done
if [ -x "$root/build/tl_make_corpus" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if "$root/build/tl_make_corpus" "$tmp" > "$build/make_corpus.log" 2>&1; then
    for f in "$tmp"/*.safetensors; do
      [ -e "$f" ] || continue
      [ "$(stat -c %s "$f")" -le "$max_len" ] && cp -n "$f" "$corpus/mc-$(basename "$f")"
    done
  else
    echo "fuzz: build/tl_make_corpus failed (build-fuzz/make_corpus.log); continuing without it" >&2
  fi
fi

# --- fuzz ----------------------------------------------------------------------------
touch "$build/.run-start"  # Artifacts newer than this are this run's findings.
set +e
"$build/tl_header_fuzz" "$corpus" \
  -max_total_time="$secs" -max_len="$max_len" -rss_limit_mb=2048 \
  -malloc_limit_mb="$malloc_limit_mb" -timeout=30 -dict="$fuzz_dir/safetensors.dict" \
  -print_final_stats=1 -artifact_prefix="$build/artifacts/" "$@" > "$log" 2>&1
rc=$?

# --- summary (set +e still holds: a crash leaves some of these lines absent) ---------
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
edges=$(sed -n 's/.*(\([0-9]*\) inline 8-bit counters).*/\1/p' "$log" | head -1)
last=$(grep -E '^#[0-9]+' "$log" | tail -1)
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
corp=$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<<"$last")
pct=""
[ -n "$cov" ] && [ -n "$edges" ] && pct=$(awk -v c="$cov" -v e="$edges" 'BEGIN{printf " (%.1f%% of %d edges)", 100*c/e, e}')
ran=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
dur=${ran:+${ran}s}
echo "fuzz: ${dur:-stopped early (of ${secs}s)}, ${execs:-?} execs (${rate:-?}/s), cov ${cov:-?}${pct}, ft ${ft:-?}, corpus ${corp:-?} (units/size in use; $(ls "$corpus" | wc -l) files in tests/fuzz/corpus-work)"
findings=$(find "$build/artifacts" -type f -newer "$build/.run-start" -printf '%f ')
if [ "$rc" -ne 0 ] || [ -n "$findings" ]; then
  echo "fuzz: FAILED (exit $rc): $(grep -m1 -E '^==[0-9]+==ERROR|^SUMMARY|invariant broken|ALARM|out-of-memory|runtime error' "$log" || echo 'see log'); artifacts in build-fuzz/artifacts: ${findings:-none}; log: build-fuzz/fuzz.log"
  exit 1
fi
echo "fuzz: no findings (log: build-fuzz/fuzz.log)"

# --- the peer manifest parser (src/remote/manifest.cc) --------------------------------
manifest_secs=${MANIFEST_SECONDS:-30}
if [ "$manifest_secs" -gt 0 ]; then
  mcorpus=$fuzz_dir/corpus-work-manifest
  mkdir -p "$mcorpus"
  cp -n "$fuzz_dir"/manifest-seeds/*.json "$mcorpus/" 2>/dev/null || true
  mlog=$build/fuzz-manifest.log
  touch "$build/.run-start"
  set +e
  "$build/tl_manifest_fuzz" "$mcorpus" -max_total_time="$manifest_secs" -max_len=65536 -rss_limit_mb=2048 \
    -malloc_limit_mb="$malloc_limit_mb" -timeout=30 -print_final_stats=1 -artifact_prefix="$build/artifacts/" \
    > "$mlog" 2>&1
  rc=$?
  set -e
  mexecs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$mlog" | tail -1)
  mcov=$(grep -E '^#[0-9]+' "$mlog" | tail -1 | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
  mfindings=$(find "$build/artifacts" -type f -newer "$build/.run-start" -printf '%f ')
  echo "fuzz (manifest): ${manifest_secs}s, ${mexecs:-?} execs, cov ${mcov:-?}"
  if [ "$rc" -ne 0 ] || [ -n "$mfindings" ]; then
    echo "fuzz (manifest): FAILED (exit $rc): $(grep -m1 -E '^==[0-9]+==ERROR|^SUMMARY|invariant broken|out-of-memory|runtime error' "$mlog" || echo 'see log'); artifacts: ${mfindings:-none}; log: build-fuzz/fuzz-manifest.log"
    exit 1
  fi
  echo "fuzz (manifest): no findings (log: build-fuzz/fuzz-manifest.log)"
fi
