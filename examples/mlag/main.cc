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
#include <cstdio>
#include <vector>

#include "examples/mlag/cli.h"

int main(int argc, char** argv) {
  CLI::App app{"mlag: serve DeepSeek-style MLA + MoE models by replaying captured graphs"};
  app.require_subcommand(1);
  const std::vector<mlag::cli::Command> commands = {
      mlag::cli::AddRunCommand(app),   mlag::cli::AddGraphsCommand(app),
      mlag::cli::AddBenchCommand(app), mlag::cli::AddExportCommand(app),
      mlag::cli::AddInfoCommand(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "mlag: error: %s\n", e.what());
    return mlag::cli::kExitUsage;
  }
  for (const mlag::cli::Command& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return 0;
}
