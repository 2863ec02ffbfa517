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
# (idempotent; FUZZ_BUILD=DIR uses DIR instead, a build its caller configured with
# TENSORLIFT_BUILD_FUZZ=ON: make test's clang ASan build, build-asan), copies each target's
# seeds into its work corpus tests/fuzz/corpus-work*/ (kept between runs, not committed),
# runs the targets, FUZZ_JOBS (the number of cores) at a time, and prints a summary line per
# target. The logs are BUILD/fuzz-NAME.log; crashes, leaks, timeouts and out-of-memory inputs
# are written to BUILD/artifacts/NAME-*. Exits non-zero on any finding or build failure.
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

build=${FUZZ_BUILD:-$root/build-fuzz}
case $build in /*) ;; *) build=$root/$build ;; esac
jobs=${FUZZ_JOBS:-$(nproc)}
fuzz_dir=$root/tests/fuzz
corpus=$fuzz_dir/corpus-work
mkdir -p "$build" "$build/artifacts" "$corpus"
targets=(tl_header_fuzz tl_manifest_fuzz tl_peer_wire_fuzz tl_registry_fuzz tl_index_fuzz tl_sparse_fuzz
         tl_s3_answers_fuzz)

# --- configure (again only when the settings change) and build ---------------------
if [ -z "${FUZZ_BUILD:-}" ]; then
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
elif ! grep -q '^TENSORLIFT_BUILD_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "fuzz: FUZZ_BUILD=$build is not a build configured with TENSORLIFT_BUILD_FUZZ=ON" >&2
  exit 1
fi
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)" > "$build/fuzz-build.log" 2>&1 \
  || { grep -E 'error|warning' "$build/fuzz-build.log" | head -40 || true; echo "fuzz: build failed ($build/fuzz-build.log)" >&2; exit 1; }

# --- seed the work corpora (idempotent) --------------------------------------------
for f in "$fuzz_dir"/seeds/*.safetensors; do
  [ -e "$f" ] && cp -n "$f" "$corpus/seed-$(basename "$f")"
done
if [ "$header_secs" -gt 0 ] && [ -x "$root/build/tl_make_corpus" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if "$root/build/tl_make_corpus" "$tmp" > "$build/make_corpus.log" 2>&1; then
    for f in "$tmp"/*.safetensors; do
      [ -e "$f" ] || continue
      [ "$(stat -c %s "$f")" -le "$max_len" ] && cp -n "$f" "$corpus/mc-$(basename "$f")"
    done
  else
    echo "fuzz: build/tl_make_corpus failed ($build/make_corpus.log); continuing without it" >&2
  fi
fi

# --- fuzz ----------------------------------------------------------------------------
# run_target NAME SECONDS CORPUS SEEDS_DIR MAX_LEN [DICT] [libFuzzer flags...]: one target;
# its summary goes to BUILD/fuzz-NAME.summary, its exit status is 1 on a finding.
run_target() {
  local name=$1 t_secs=$2 tcorpus=$3 seeds=$4 t_max_len=$5 dict=$6
  shift 6
  local tlog=$build/fuzz-$name.log summary=$build/fuzz-$name.summary rc
  mkdir -p "$tcorpus"
  [ -n "$seeds" ] && { cp -n "$seeds"/* "$tcorpus/" 2>/dev/null || true; }
  rm -f "$build/artifacts/$name-"*
  set +e
  "$build/tl_${name//-/_}_fuzz" "$tcorpus" -max_total_time="$t_secs" -max_len="$t_max_len" \
    -rss_limit_mb=2048 -malloc_limit_mb="$malloc_limit_mb" -timeout=30 -print_final_stats=1 \
    ${dict:+-dict="$dict"} -artifact_prefix="$build/artifacts/$name-" "$@" > "$tlog" 2>&1
  rc=$?
  set -e
  # (A crash leaves some of these lines absent.)
  local execs rate edges last cov ft corp pct ran findings dur
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tlog" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$tlog" | tail -1)
  edges=$(sed -n 's/.*(\([0-9]*\) inline 8-bit counters).*/\1/p' "$tlog" | head -1)
  last=$(grep -E '^#[0-9]+' "$tlog" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<<"$last")
  pct=""
  [ -n "$cov" ] && [ -n "$edges" ] && pct=$(awk -v c="$cov" -v e="$edges" 'BEGIN{printf " (%.1f%% of %d edges)", 100*c/e, e}')
  ran=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$tlog" | tail -1)
  findings=$(find "$build/artifacts" -type f -name "$name-*" -printf '%f ')
  local dur="stopped early (of ${t_secs}s)"
  [ -n "$ran" ] && dur=${ran}s
  {
    echo "fuzz ($name): $dur, ${execs:-?} execs (${rate:-?}/s), cov ${cov:-?}${pct}, ft ${ft:-?}, corpus ${corp:-?} (units/size in use; $(ls "$tcorpus" | wc -l) files)"
    if [ "$rc" -ne 0 ] || [ -n "$findings" ]; then
      echo "fuzz ($name): FAILED (exit $rc): $(grep -m1 -E '^==[0-9]+==ERROR|^SUMMARY|invariant broken|ALARM|out-of-memory|runtime error' "$tlog" || echo 'see log'); artifacts: ${findings:-none}; log: $tlog"
    fi
  } > "$summary"
  [ "$rc" -eq 0 ] && [ -z "$findings" ]
}

dsecs=${DECODER_SECONDS:-$secs}
# NAME SECONDS CORPUS SEEDS MAX_LEN DICT, the longest first.
plan=("header $header_secs $corpus - $max_len $fuzz_dir/safetensors.dict"
      "manifest ${MANIFEST_SECONDS:-$secs} $fuzz_dir/corpus-work-manifest $fuzz_dir/manifest-seeds 65536 -"
      "peer-wire $dsecs $fuzz_dir/corpus-work-peer-wire $fuzz_dir/seeds-peer-wire 65536 $fuzz_dir/json.dict"
      "registry $dsecs $fuzz_dir/corpus-work-registry $fuzz_dir/seeds-registry 65536 $fuzz_dir/json.dict"
      "index $dsecs $fuzz_dir/corpus-work-index $fuzz_dir/seeds-index 65536 $fuzz_dir/json.dict"
      "sparse $dsecs $fuzz_dir/corpus-work-sparse $fuzz_dir/seeds-sparse $max_len $fuzz_dir/safetensors.dict"
      "s3-answers $dsecs $fuzz_dir/corpus-work-s3-answers $fuzz_dir/seeds-s3 65536 $fuzz_dir/s3.dict")
names=() pids=()
for p in "${plan[@]}"; do
  read -r name t_secs tcorpus seeds t_max_len dict <<<"$p"
  [ "$t_secs" -gt 0 ] || continue
  [ "$seeds" = - ] && seeds=""
  [ "$dict" = - ] && dict=""
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  rm -f "$build/fuzz-$name.summary"
  run_target "$name" "$t_secs" "$tcorpus" "$seeds" "$t_max_len" "$dict" "$@" &
  names+=("$name") pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" 2>/dev/null || true  # (wait -n may have reaped it: the summary says how it went)
  summary=$build/fuzz-${names[$i]}.summary
  if [ -s "$summary" ]; then cat "$summary"; else echo "fuzz (${names[$i]}): FAILED: it left no summary"; failed=1; fi
  ! grep -q FAILED "$summary" 2>/dev/null || failed=1
done
[ "$failed" -eq 0 ] && echo "fuzz: no findings (logs: $build/fuzz-*.log)"
exit "$failed"
