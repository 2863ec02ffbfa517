#!/usr/bin/env bash
# Fuzzes every decoder of untrusted bytes: tests/fuzz/run.sh SECONDS [libFuzzer flags...]
# runs each target for SECONDS (HEADER_SECONDS overrides it for the header parser,
# MANIFEST_SECONDS for the manifest, DECODER_SECONDS for the others; 0 skips):
#   tl_header_fuzz      safetensors headers (seeds: seeds/, build/tl_make_corpus)
#   tl_manifest_fuzz    the peer manifest (manifest-seeds/)
#   tl_peer_wire_fuzz   GET /v1/key, UCX frames, auth headers, peer URLs (seeds-peer-wire/)
#   tl_registry_fuzz    etcd range replies and seed entries (seeds-registry/)
#   tl_index_fuzz       the sharded index json (seeds-index/)
#   tl_sparse_fuzz      sparse-bitmask groups, found and decoded (seeds-sparse/)
#   tl_s3_answers_fuzz  S3 listings, <Error> bodies, Content-Range, keys (seeds-s3/)
# make_seeds.py wrote the seeds-*/ folders (committed).
#
# Configures and builds build-fuzz with clang and -fsanitize=fuzzer,address,undefined
# (idempotent), copies each target's seeds into its work corpus tests/fuzz/corpus-work*/
# (kept between runs, not committed), runs it and prints a summary line per target. The
# logs are build-fuzz/fuzz*.log; crashes, leaks, timeouts and out-of-memory inputs are
# written to build-fuzz/artifacts/. Exits non-zero on any finding or build failure.
#
# Limits: inputs up to MAX_LEN bytes (1 MiB; 64 KiB for the JSON, XML and wire targets);
# no single allocation over MALLOC_LIMIT_MB (32 MiB, i.e. 32x the largest input; the
# header target itself also checks that every input's allocations stay within a small
# multiple of its own size); RSS 2 GiB; 30 s per input.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
secs=${1:?usage: tests/fuzz/run.sh SECONDS [libFuzzer flags...]}
header_secs=${HEADER_SECONDS:-$secs}
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
targets=(tl_header_fuzz tl_manifest_fuzz tl_peer_wire_fuzz tl_registry_fuzz tl_index_fuzz tl_sparse_fuzz
         tl_s3_answers_fuzz)
cmake --build "$build" --target "${targets[@]}" -j 2 > "$build/build.log" 2>&1 \
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
if [ "$header_secs" -gt 0 ]; then
touch "$build/.run-start"  # Artifacts newer than this are this run's findings.
set +e
"$build/tl_header_fuzz" "$corpus" \
  -max_total_time="$header_secs" -max_len="$max_len" -rss_limit_mb=2048 \
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
echo "fuzz: ${dur:-stopped early (of ${header_secs}s)}, ${execs:-?} execs (${rate:-?}/s), cov ${cov:-?}${pct}, ft ${ft:-?}, corpus ${corp:-?} (units/size in use; $(ls "$corpus" | wc -l) files in tests/fuzz/corpus-work)"
findings=$(find "$build/artifacts" -type f -newer "$build/.run-start" -printf '%f ')
if [ "$rc" -ne 0 ] || [ -n "$findings" ]; then
  echo "fuzz: FAILED (exit $rc): $(grep -m1 -E '^==[0-9]+==ERROR|^SUMMARY|invariant broken|ALARM|out-of-memory|runtime error' "$log" || echo 'see log'); artifacts in build-fuzz/artifacts: ${findings:-none}; log: build-fuzz/fuzz.log"
  exit 1
fi
echo "fuzz: no findings (log: build-fuzz/fuzz.log)"
set -e
fi

# --- the other decoders -------------------------------------------------------------
# run_target NAME SECONDS SEEDS_DIR MAX_LEN [DICT]
run_target() {
  local name=$1 t_secs=$2 seeds=$3 t_max_len=$4 dict=${5:-}
  [ "$t_secs" -gt 0 ] || return 0
  local tcorpus=$fuzz_dir/corpus-work-$name tlog=$build/fuzz-$name.log rc
  mkdir -p "$tcorpus"
  cp -n "$seeds"/* "$tcorpus/" 2>/dev/null || true
  touch "$build/.run-start"
  set +e
  "$build/tl_${name//-/_}_fuzz" "$tcorpus" -max_total_time="$t_secs" -max_len="$t_max_len" \
    -rss_limit_mb=2048 -malloc_limit_mb="$malloc_limit_mb" -timeout=30 -print_final_stats=1 \
    ${dict:+-dict="$dict"} -artifact_prefix="$build/artifacts/$name-" > "$tlog" 2>&1
  rc=$?
  set -e
  local texecs tcov tfindings
  texecs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tlog" | tail -1)
  tcov=$(grep -E '^#[0-9]+' "$tlog" | tail -1 | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
  tfindings=$(find "$build/artifacts" -type f -newer "$build/.run-start" -printf '%f ')
  echo "fuzz ($name): ${t_secs}s, ${texecs:-?} execs, cov ${tcov:-?}, corpus $(ls "$tcorpus" | wc -l) files"
  if [ "$rc" -ne 0 ] || [ -n "$tfindings" ]; then
    echo "fuzz ($name): FAILED (exit $rc): $(grep -m1 -E '^==[0-9]+==ERROR|^SUMMARY|invariant broken|out-of-memory|runtime error' "$tlog" || echo 'see log'); artifacts: ${tfindings:-none}; log: build-fuzz/fuzz-$name.log"
    return 1
  fi
}

dsecs=${DECODER_SECONDS:-$secs}
failed=0
run_target manifest "${MANIFEST_SECONDS:-$secs}" "$fuzz_dir/manifest-seeds" 65536 || failed=1
run_target peer-wire "$dsecs" "$fuzz_dir/seeds-peer-wire" 65536 "$fuzz_dir/json.dict" || failed=1
run_target registry "$dsecs" "$fuzz_dir/seeds-registry" 65536 "$fuzz_dir/json.dict" || failed=1
run_target index "$dsecs" "$fuzz_dir/seeds-index" 65536 "$fuzz_dir/json.dict" || failed=1
run_target sparse "$dsecs" "$fuzz_dir/seeds-sparse" "$max_len" "$fuzz_dir/safetensors.dict" || failed=1
run_target s3-answers "$dsecs" "$fuzz_dir/seeds-s3" 65536 "$fuzz_dir/s3.dict" || failed=1
exit "$failed"
