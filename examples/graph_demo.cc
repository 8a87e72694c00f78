// Smallest demonstration of the runtime: capture three named ops into a graph
// on the chosen device, print the node list, replay it and print the result.
//
//   mlag-graph-demo [auto|host|cuda]
#include <cstdio>
#include <vector>

#include "kernels/elementwise.h"
#include "runtime/core/device.h"
#include "runtime/core/status.h"
#include "runtime/core/stream.h"

namespace {

absl::Status Run(const char* device_spec) {
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<mlag::Device> device, mlag::Device::Create(device_spec));
  std::printf("device: %s — %s\n", device->name().c_str(), device->selection_reason().c_str());
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<mlag::Stream> stream, mlag::Stream::Create(device.get()));

  constexpr int64_t n = 8;
  MLAG_ASSIGN_OR_RETURN(mlag::Buffer xb, device->Allocate(n * sizeof(float)));
  MLAG_ASSIGN_OR_RETURN(mlag::Buffer yb, device->Allocate(n * sizeof(float)));
  mlag::Tensor x = xb.AsTensor(mlag::DType::kF32, {n});
  mlag::Tensor y = yb.AsTensor(mlag::DType::kF32, {n});

  // y = 3 * x + x, then y += y: y = 8x.
  MLAG_RETURN_IF_ERROR(stream->BeginCapture());
  {
    mlag::NodeScope s(*stream, "demo.scale", mlag::OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(mlag::Scale(*stream, x, 3.0f, y));
  }
  {
    mlag::NodeScope s(*stream, "demo.add_input", mlag::OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(mlag::Add(*stream, y, x, y));
  }
  {
    mlag::NodeScope s(*stream, "demo.double", mlag::OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(mlag::Add(*stream, y, y, y));
  }
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<mlag::Graph> graph, stream->EndCapture());

  std::printf("captured graph: %zu nodes\n", graph->nodes().size());
  for (const mlag::GraphNode& node : graph->nodes()) {
    std::printf("  %-16s %s\n", node.name.c_str(), std::string(mlag::OpKindName(node.kind)).c_str());
  }

  for (int round = 1; round <= 2; ++round) {
    std::vector<float> host_x(n), host_y(n);
    for (int64_t i = 0; i < n; ++i) host_x[i] = static_cast<float>(round * (i + 1));
    MLAG_RETURN_IF_ERROR(device->CopyFromHost(x.data(), host_x.data(), n * sizeof(float)));
    MLAG_RETURN_IF_ERROR(graph->Replay(*stream));
    MLAG_RETURN_IF_ERROR(stream->Synchronize());
    MLAG_RETURN_IF_ERROR(device->CopyToHost(host_y.data(), y.data(), n * sizeof(float)));
    std::printf("replay %d: x =", round);
    for (float v : host_x) std::printf(" %g", v);
    std::printf("\n          y =");
    for (float v : host_y) std::printf(" %g", v);
    std::printf("   (expected 8x)\n");
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::Status s = Run(argc > 1 ? argv[1] : "auto");
  if (!s.ok()) {
    std::fprintf(stderr, "mlag-graph-demo: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
