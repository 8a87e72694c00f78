// mlag: the command line of mlagraph. One file per subcommand:
//
//   mlag run    serve a batch of requests, print tokens and a summary (run.cc)
//   mlag graphs capture every graph size and list the nodes     (graphs.cc)
//   mlag bench  decode and prefill speed against measured ceilings (bench.cc)
//   mlag export write a model as config.json + safetensors     (export.cc)
//   mlag info   build a model and describe it                    (info.cc)
//
// Every error from a flag, a file or a model is one line on stderr naming
// the problem, with exit code 2.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "examples/mlag/cli.h"

int main(int argc, char** argv) {
  CLI::App app{"mlag: serve DeepSeek-style MLA + MoE models by replaying captured graphs"};
  app.require_subcommand(1);
  const std::vector<mlag::cli::Command> commands = {
      mlag::cli::AddRunCommand(app),        mlag::cli::AddGraphsCommand(app),
      mlag::cli::AddBenchCommand(app),      mlag::cli::AddExportCommand(app),
      mlag::cli::AddInfoCommand(app),       mlag::cli::AddServeCommand(app),
      mlag::cli::AddBenchServeCommand(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::RequiredError& e) {
    // An unknown subcommand leaves no subcommand parsed: name what was given.
    if (!app.remaining().empty() && app.get_subcommands().empty()) {
      std::fprintf(stderr,
                   "mlag: error: unknown subcommand '%s' (expected run, graphs, bench, "
                   "export, info, serve or bench-serve)\n",
                   app.remaining().front().c_str());
    } else {
      std::fprintf(stderr, "mlag: error: %s\n", e.what());
    }
    return mlag::cli::kExitUsage;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "mlag: error: %s\n", e.what());
    return mlag::cli::kExitUsage;
  }
  int rc = 0;
  try {
    for (const mlag::cli::Command& c : commands) {
      if (c.app->parsed()) rc = c.run();
    }
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mlag: error: out of memory (an allocation failed)\n");
    return mlag::cli::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlag: error: %s\n", e.what());
    return mlag::cli::kExitUsage;
  }
  // Output that never reached its file (a full disk, a closed pipe) is an
  // error, not a success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    const int err = errno;
    std::fprintf(stderr, "mlag: error: writing standard output: %s\n",
                 err != 0 ? std::strerror(err) : "write error");
    return mlag::cli::kExitUsage;
  }
  return rc;
}
