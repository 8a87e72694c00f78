// mlag graphs: capture every graph size of an engine and list each graph's
// ops with their kinds, as the graph itself records them: on CUDA read from
// the captured cudaGraph_t, with the number of its nodes each op became;
// --dot writes Graphviz.
//
//   mlag graphs --model M [--size N] [--dot FILE] [engine flags]
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "examples/mlag/cli.h"
#include "runtime/core/file.h"

namespace mlag::cli {
namespace {

struct GraphsFlags {
  EngineFlags engine;
  int size = 0;  // 0: every size
  std::string dot_file;
};

int Graphs(const GraphsFlags& f) {
  absl::StatusOr<EngineOptions> options = f.engine.ToOptions();
  if (!options.ok()) return Fail(options.status());
  if (options->graph_mode == GraphMode::kNone) {
    return Fail(absl::InvalidArgumentError("mlag graphs needs --graph-mode full-decode"));
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*options);
  if (!engine.ok()) return Fail(engine.status());
  ModelRunner& runner = (*engine)->runner();
  if (f.size > 0 && runner.graph(f.size) == nullptr) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("no graph of size ", f.size)));
  }
  std::string dot = "digraph mlagraph {\n  rankdir=TB;\n  node [shape=box, fontname=monospace];\n";
  std::printf("%d graphs captured in %.3f s on %s\n", runner.num_graphs(),
              runner.stats().capture_seconds, (*engine)->device().name().c_str());
  for (auto it = runner.capture_sizes().rbegin(); it != runner.capture_sizes().rend(); ++it) {
    const int size = *it;
    if (f.size > 0 && size != f.size) continue;
    const Graph* g = runner.graph(size);
    const char* unit = (*engine)->device().is_cuda() ? "CUDA graph node" : "host closure";
    int device_nodes = 0;
    for (const GraphNode& n : g->nodes()) device_nodes += n.device_nodes;
    std::printf("size %d: %zu ops, %d %ss\n", size, g->nodes().size(), device_nodes, unit);
    for (const GraphNode& n : g->nodes()) {
      std::printf("  %s %s (%d %s%s)\n", n.name.c_str(), std::string(OpKindName(n.kind)).c_str(),
                  n.device_nodes, unit, n.device_nodes == 1 ? "" : "s");
    }
    absl::StrAppend(&dot, "  subgraph cluster_", size, " {\n    label=\"size ", size, "\";\n");
    for (size_t i = 0; i < g->nodes().size(); ++i) {
      const GraphNode& n = g->nodes()[i];
      absl::StrAppend(&dot, "    s", size, "_", i, " [label=\"", n.name, "\\n", OpKindName(n.kind),
                      "\"];\n");
      if (i > 0) absl::StrAppend(&dot, "    s", size, "_", i - 1, " -> s", size, "_", i, ";\n");
    }
    absl::StrAppend(&dot, "  }\n");
  }
  if (!f.dot_file.empty()) {
    dot += "}\n";
    if (absl::Status written = WriteFileAtomically(f.dot_file, {dot}); !written.ok()) {
      return Fail(written);
    }
    std::printf("wrote %s\n", f.dot_file.c_str());
  }
  return 0;
}

}  // namespace

Command AddGraphsCommand(CLI::App& app) {
  auto f = std::make_shared<GraphsFlags>();
  CLI::App* graphs = app.add_subcommand("graphs", "capture every graph size and list the nodes");
  f->engine.Register(graphs);
  graphs->add_option("--size", f->size, "only this capture size")->check(AtLeast(1));
  graphs->add_option("--dot", f->dot_file, "also write Graphviz to this file");
  return {graphs, [f] { return Graphs(*f); }};
}

}  // namespace mlag::cli
