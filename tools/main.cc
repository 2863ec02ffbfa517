// tensorlift: the command-line tool. A thin layer over the public API.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "tensorlift/crash.h"
#include "tensorlift/version.h"

namespace {

// --endpoint-url, --region, --profile, --no-sign-request (the AWS CLI's names).
void AddStoreOptions(CLI::App* app, tensorlift::cli::StoreArgs* store) {
  app->add_option("--endpoint-url", store->endpoint,
                  "s3:// and gs:// paths: the S3 endpoint (default: AWS_ENDPOINT_URL, else AWS)");
  app->add_option("--region", store->region, "s3:// paths: the region (default: AWS_REGION)");
  app->add_option("--profile", store->profile,
                  "s3:// paths: the profile of ~/.aws/credentials and ~/.aws/config");
  app->add_flag("--no-sign-request", store->no_sign,
                "s3:// paths: send unsigned requests (public buckets)");
}

}  // namespace

int main(int argc, char** argv) {
  // A fatal signal leaves a report on stderr (include/tensorlift/crash.h).
  tensorlift::InstallCrashHandler();
  using namespace tensorlift::cli;
  CLI::App app{"tensorlift: moves model weights into memory fast and safely"};
  app.name("tensorlift");
  app.set_version_flag("--version", std::string("tensorlift ") + tensorlift::kVersion);
  app.require_subcommand(1);

  std::string inspect_path;
  bool inspect_json = false;
  auto* inspect = app.add_subcommand(
      "inspect", "Show the tensors of a .safetensors file, an index, or a directory of shards");
  StoreArgs inspect_store, verify_store;
  inspect
      ->add_option("PATH", inspect_path,
                   "File, model.safetensors.index.json, or directory; or s3://bucket/key-or-prefix")
      ->required();
  inspect->add_flag("--json", inspect_json, "Print JSON for machines");
  AddStoreOptions(inspect, &inspect_store);

  std::vector<std::string> verify_paths;
  bool verify_quiet = false;
  auto* verify = app.add_subcommand(
      "verify",
      "Check files completely; exit 0 if all are valid, else print PATH: error per bad one");
  verify->add_option("PATH", verify_paths, "Files, indexes or directories (or s3:// URLs)")
      ->required();
  verify->add_flag("-q,--quiet", verify_quiet, "Print nothing for valid files");
  std::string verify_sha256;
  verify
      ->add_option("--sha256", verify_sha256,
                   "Also check every file's SHA-256 (all cores, at disk speed) against SOURCE: a "
                   "sha256sum file; a JSON file of name: digest or the Hub API's \"siblings\"; or "
                   "hub: the blob names of a Hugging Face cache snapshot (PATH in "
                   "models--ORG--NAME/snapshots/REV/)")
      ->type_name("SOURCE|hub");
  AddStoreOptions(verify, &verify_store);

  LoadArgs load_args;
  auto* load = app.add_subcommand(
      "load", "Load tensors into memory and report bytes, time, GB/s and the mode per file");
  load->add_option("PATH", load_args.path,
                   "File, model.safetensors.index.json, or directory; or s3://bucket/key-or-prefix")
      ->required();
  AddStoreOptions(load, &load_args.store);
  load->add_option("--cache-dir", load_args.store.cache_dir,
                   "s3:// paths: keep whole objects in DIR and read them from there while the "
                   "bucket lists the same ETag");
  load->add_option("--tp-size", load_args.store.tp_size,
                   "load only this tensor-parallel rank's slices of the tensors --layout "
                   "splits, among this many ranks (only the slices' bytes are read)")
      ->check(CLI::Range(1, 65536));
  load->add_option("--tp-rank", load_args.store.tp_rank,
                   "this tensor-parallel rank (with --tp-size)")
      ->check(CLI::Range(0, 65535));
  load->add_option("--layout", load_args.store.layout,
                   "the sharding rules REGEX=DIM;... (docs/remote.md, \"Layouts\")");
  load->add_option("--filter", load_args.filter, "Load only tensors whose name matches this regex");
  load->add_option("--mode", load_args.mode, "I/O mode")
      ->check(CLI::IsMember({"auto", "buffered", "direct", "mmap"}))
      ->capture_default_str();
  load->add_flag(
      "--copy", load_args.copy,
      "auto: read page-cached files into memory of their own instead of viewing the page cache");
  load->add_option("--engine", load_args.engine, "Read engine")
      ->check(CLI::IsMember({"auto", "threads", "uring"}))
      ->capture_default_str();
  load->add_option("--threads", load_args.threads, "pread threads (0: automatic)")
      ->check(CLI::Range(0, 1024));
  load->add_option("--queue-depth", load_args.queue_depth, "io_uring reads in flight")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  load->add_option("--block-size", load_args.block_mib, "Largest single read, in MiB")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  load->add_flag(
      "--checksum", load_args.checksum,
      "Print name<TAB>xxh3-64 of each tensor's bytes, sorted by name (summary to stderr)");
  load->add_flag("!--no-progress", load_args.progress, "Never draw the progress bar");
  load->add_option("--device", load_args.device, "Where the tensors go: cpu, cuda or cuda:N")
      ->capture_default_str();
  load->add_option(
      "--dtype", load_args.dtype,
      "Convert floating-point tensors (F32/F16/BF16/F8) to F32, F16 or BF16 while loading");
  load->add_option(
          "--staging-buffers", load_args.staging_buffers,
          "GPU loads: pinned staging buffers (0: a read per CPU, 4 to 16, with two buffers each)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  load->add_option("--staging-size", load_args.staging_mib,
                   "GPU loads: bytes per staging buffer, in MiB")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  load->add_flag("!--no-gds", load_args.gds, "GPU loads: never use GPUDirect Storage");
  load->add_flag("!--no-content-hash", load_args.content_hash,
                 "Do not compute the content identity (hashed as the reads land otherwise)");
  load->add_flag("--mpi", load_args.mpi,
                 "Run as one rank of an MPI job (mpirun -n N tensorlift load --mpi ...): each rank "
                 "reads its balanced share once; rank 0 reports every rank (host memory, or with "
                 "--device cuda each rank's own GPU, the tensors moved over NCCL)");

  SparsifyArgs sparsify_args;
  auto* sparsify = app.add_subcommand(
      "sparsify",
      "Write a sparse-bitmask (compressed-tensors) copy of a checkpoint: zeros cost one bit");
  sparsify
      ->add_option("IN", sparsify_args.input, "File, model.safetensors.index.json, or directory")
      ->required();
  sparsify->add_option("OUT", sparsify_args.output, "Output directory (new or empty)")->required();
  sparsify
      ->add_option(
          "--prune", sparsify_args.prune,
          "none, or magnitude:FRACTION: zero that fraction of each target row, smallest |x| first")
      ->capture_default_str();
  sparsify
      ->add_option("--min-sparsity", sparsify_args.min_sparsity,
                   "Encode a target only if at least this fraction of it is zero")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sparsify
      ->add_option("--targets", sparsify_args.targets,
                   "Regex (searched) for the tensors to encode; only 2-D floating-point ones are")
      ->capture_default_str();
  sparsify
      ->add_option("--max-shard-size", sparsify_args.max_shard_size,
                   "Tensor bytes per output shard: BYTES, or with KB, MB, GB, KiB, MiB, GiB")
      ->capture_default_str();
  sparsify->add_flag(
      "--no-sparsity-config", sparsify_args.no_sparsity_config,
      "Copy config.json unchanged (no quantization_config.sparsity_config): for servers that "
      "refuse it, such as vLLM 0.32 with --load-format tensorlift, which decodes the weights");

  auto add_peer = [](CLI::App* cmd, PeerArgs& p) {
    cmd->add_option("--model", p.model, "Model id of the key (default: the checkpoint's name)");
    cmd->add_option("--revision", p.revision,
                    "Revision of the key (default: a digest of the headers)");
    cmd->add_option("--dtype", p.dtype,
                    "Dtype of the key: as-stored, or what the tensors were converted to (BF16, "
                    "bfloat16, ...)")
        ->capture_default_str();
    cmd->add_option("--quantization", p.quantization, "Quantization of the key")
        ->capture_default_str();
    cmd->add_option("--layout", p.layout, "Sharding rules REGEX=DIM;... (docs/remote.md)");
    cmd->add_option("--tp-size", p.tp_size, "Tensor-parallel size of this side")
        ->check(CLI::Range(1, 65536))
        ->capture_default_str();
    cmd->add_option("--tp-rank", p.tp_rank, "Tensor-parallel rank of this side")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
    cmd->add_option("--transports", p.transports,
                    "UCX transports (UCX_TLS syntax, e.g. tcp or sm,self)");
  };
  ServeArgs serve_args;
  auto* serve =
      app.add_subcommand("serve", "Load a checkpoint and serve it to peers until interrupted");
  serve->add_option("PATH", serve_args.path, "File, model.safetensors.index.json, or directory")
      ->required();
  add_peer(serve, serve_args.peer);
  serve->add_option("--host", serve_args.host, "Address to listen on and advertise")
      ->capture_default_str();
  serve->add_option("--port", serve_args.port, "Control port (0: any free one)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  serve->add_option("--registry", serve_args.registry,
                    "etcd endpoint to register with (http://host:port)");
  serve
      ->add_option("--registry-ttl", serve_args.registry_ttl_s,
                   "Seconds the registration outlives this process")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  serve->add_option("--token-file", serve_args.token_file,
                    "Require requests signed with this token (chmod 600)");
  serve
      ->add_option("--rate-limit", serve_args.rate_limit_mbps,
                   "MB/s all clients may pull in total (0: no limit)")
      ->check(CLI::Range(0.0, 1e9));
  serve
      ->add_option("--chunk-bytes", serve_args.chunk_bytes,
                   "Bytes per checksum chunk that clients check (4 KiB to 1 GiB; 0: 4 MiB, "
                   "smaller for checkpoints under 512 MiB, at least 128 chunks and 64 KiB)")
      ->capture_default_str()
      ->check(CLI::IsMember({uint64_t{0}}) | CLI::Range(uint64_t{4096}, uint64_t{1} << 30));
  serve
      ->add_option("--device", serve_args.device,
                   "Serve from this device's memory: cpu, or cuda:N (GPU memory needs a UCX "
                   "built with CUDA: TENSORLIFT_UCX_LIB, docs/remote.md)")
      ->capture_default_str();
  serve->add_option("--max-sessions", serve_args.max_sessions, "Concurrent clients")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  serve
      ->add_option("--clients-per-worker", serve_args.clients_per_worker,
                   "Sessions one UCX worker takes before new ones get a fresh worker, the old "
                   "one going with its last session; UCX keeps ~85 bytes per client a worker "
                   "has met (0: one worker for good)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40))
      ->capture_default_str();
  serve->add_flag("--resident", serve_args.resident,
                  "Announce this seed on this host under its key, so that clients here find it "
                  "with the key alone (no URL or registry): keeps a model in memory while servers "
                  "come and go (docs/remote.md, \"Same-host handover\")");
  serve->add_flag("--no-handover", serve_args.no_handover,
                  "Do not hand the memory to clients on this host (they pull copies over UCX)");
  serve->add_option("--ready-file", serve_args.ready_file,
                    "Write the URL to this file once serving");

  FetchArgs fetch_args;
  auto* fetch = app.add_subcommand(
      "fetch", "Pull a checkpoint from a running peer (or the registry's seeds)");
  fetch->add_option("URL", fetch_args.urls,
                    "Peer control endpoints http://host:port, tried in order");
  add_peer(fetch, fetch_args.peer);
  fetch->add_option("--registry", fetch_args.registry, "etcd endpoint to find seeds for the key");
  fetch->add_option("--token-file", fetch_args.token_file, "Sign requests with this token");
  fetch->add_option("--fallback", fetch_args.fallback,
                    "Checkpoint to load when no peer works: a path, or s3://bucket/key-or-prefix "
                    "(with --stripe: a path and/or a URL, used at once with the peers)");
  fetch->add_flag("--stripe", fetch_args.stripe,
                  "Use every source at once: the peers, the local copy and the bucket share the "
                  "ranges, faster ones taking more (whole tensors; docs/object-storage.md)");
  fetch->add_flag("--stripe-cached", fetch_args.stripe_cached,
                  "With --stripe: stripe even when the local copy is in the page cache (by default "
                  "it is then loaded from alone, as views: nothing is faster)");
  AddStoreOptions(fetch, &fetch_args.store);
  fetch->add_option("--out", fetch_args.out, "Write the tensors to DIR/model.safetensors");
  fetch->add_option("--content", fetch_args.content,
                    "Exactly the bytes of this content root (32 hex digits, as tensorlift load "
                    "prints): seeds with another root or other bytes are refused");
  fetch
      ->add_option("--device", fetch_args.device,
                   "Where the tensors go: cpu, or cuda:N (straight into GPU memory when UCX has "
                   "CUDA support: TENSORLIFT_UCX_LIB, docs/remote.md)")
      ->capture_default_str();
  fetch->add_flag(
      "--checksum", fetch_args.checksum,
      "Print name<TAB>xxh3-64 of each tensor's bytes, as tensorlift load --checksum does");
  fetch
      ->add_option("--timeout-ms", fetch_args.timeout_ms,
                   "Each request, connection and stalled pull")
      ->check(CLI::Range(100, 3600000))
      ->capture_default_str();
  fetch
      ->add_option("--min-rate", fetch_args.min_rate_mbps,
                   "MB/s a peer must grant and send; one below it is dropped once a pull is "
                   "--timeout-ms old (0: no floor)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  fetch->add_flag("--seed", fetch_args.seed,
                  "Then serve what was pulled (registered with --registry) until interrupted");
  fetch->add_option("--seed-host", fetch_args.seed_host,
                    "The address a seed (--seed) or relay listens on and advertises (default: "
                    "127.0.0.1 for a seed; for a relay, this host's address toward the registry)");
  fetch->add_flag("--no-relay", fetch_args.no_relay,
                  "With --registry: do not relay (by default a pull serves what it has received "
                  "to later pullers while it receives, and takes from earlier ones: "
                  "docs/remote.md, \"Relaying\")");
  fetch
      ->add_option("--relay-rate-limit", fetch_args.relay_rate_limit,
                   "MB/s a relay lets later pullers take from it in all (0: no limit)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  fetch
      ->add_option("--registry-ttl", fetch_args.registry_ttl_s,
                   "With --seed: the registration's lease, seconds")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  fetch
      ->add_option("--handover", fetch_args.handover,
                   "auto: map a same-host seed's memory when it offers it (no copy); off: always "
                   "pull over UCX")
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  fetch->add_flag("--handover-verify", fetch_args.handover_verify,
                  "Check every chunk of handed-over memory against the seed's manifest");
  fetch->add_flag("--copy-on-write", fetch_args.copy_on_write,
                  "Map handed-over memory writable, each page written becoming this process's "
                  "own (default: read-only)");
  fetch->add_flag("--no-local", fetch_args.no_local,
                  "Do not ask this host's resident seed for the key (serve --resident)");
  fetch->add_option("--ready-file", fetch_args.ready_file,
                    "With --seed: write the seed's URL here once serving");

  std::string doctor_path;
  bool doctor_json = false;
  auto* doctor = app.add_subcommand(
      "doctor", "Show what was built and what works here: CUDA, GPUs, io_uring, GPUDirect Storage");
  doctor->add_option("PATH", doctor_path,
                     "A file or directory whose filesystem to check for GPUDirect Storage");
  doctor->add_flag("--json", doctor_json, "Print JSON for machines");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (*inspect) return RunInspect(inspect_path, inspect_json, inspect_store);
  if (*verify) return RunVerify(verify_paths, verify_quiet, verify_store, verify_sha256);
  if (*load) return RunLoad(load_args);
  if (*doctor) return RunDoctor(doctor_path, doctor_json);
  if (*sparsify) return RunSparsify(sparsify_args);
  if (*serve) return RunServe(serve_args);
  if (*fetch) return RunFetch(fetch_args);
  return kExitUsage;
}
