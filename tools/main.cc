// tensorlift: the command-line tool. A thin layer over the public API.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "commands.h"
#include "tensorlift/version.h"

int main(int argc, char** argv) {
  using namespace tensorlift::cli;
  CLI::App app{"tensorlift: moves model weights into memory fast and safely"};
  app.name("tensorlift");
  app.set_version_flag("--version", std::string("tensorlift ") + tensorlift::kVersion);
  app.require_subcommand(1);

  std::string inspect_path;
  bool inspect_json = false;
  auto* inspect = app.add_subcommand(
      "inspect", "Show the tensors of a .safetensors file, an index, or a directory of shards");
  inspect->add_option("PATH", inspect_path, "File, model.safetensors.index.json, or directory")
      ->required();
  inspect->add_flag("--json", inspect_json, "Print JSON for machines");

  std::vector<std::string> verify_paths;
  bool verify_quiet = false;
  auto* verify = app.add_subcommand(
      "verify", "Check files completely; exit 0 if all are valid, else print PATH: error per bad one");
  verify->add_option("PATH", verify_paths, "Files, indexes or directories")->required();
  verify->add_flag("-q,--quiet", verify_quiet, "Print nothing for valid files");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (*inspect) return RunInspect(inspect_path, inspect_json);
  if (*verify) return RunVerify(verify_paths, verify_quiet);
  return kExitUsage;
}
