// Bulk host-to-device copies for loading weights.
//
// Device::CopyFromHost waits for the whole device after every copy, and a
// pageable cudaMemcpy runs at a fraction of the link's speed: loading a model
// tensor by tensor through it leaves the GPU idle while the host reads and
// converts, and the host idle while the DMA runs. An Uploader instead copies
// each source into one of a ring of page-locked staging chunks and queues the
// chunk's cudaMemcpyAsync on a stream of its own, so the host fills chunk
// i + 1 (and reads the next tensor) while chunk i crosses the bus.
//
// With the default ring (4 chunks of 16 MiB) up to 48 MiB are in flight while
// the host fills the fourth: enough to keep a PCIe 5 x16 link (~50 GB/s,
// ~1 ms per chunk) busy. Its speed is then the slower of the link and the
// host's single-threaded copy into the chunk (~8-12 GB/s here): a 9 GB bf16
// model goes up in about a second once read.
//
// Contract: Copy returns as soon as `host_src` may be reused or freed; the
// bytes are on the device, visible to work on any stream launched afterwards,
// only once Finish has returned OK. A destination must not be read or written
// by other device work between its Copy and Finish. On the host device Copy is
// a memcpy and Finish does nothing.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "runtime/core/device.h"

namespace mlag {

class Uploader {
 public:
  static constexpr size_t kDefaultChunkBytes = size_t{16} << 20;
  static constexpr int kDefaultChunks = 4;

  // Staging is allocated at the first copy to a CUDA device, not here.
  explicit Uploader(Device* device, size_t chunk_bytes = kDefaultChunkBytes,
                    int chunks = kDefaultChunks);
  ~Uploader();  // Finish; an error there is dropped (call Finish to see it)
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  absl::Status Copy(void* device_dst, const void* host_src, size_t bytes);
  absl::Status Finish();

  // Bytes copied since construction (for load reports).
  size_t bytes_copied() const { return bytes_copied_; }

 private:
  absl::Status Start();  // the staging ring, its events and the stream
  void ReleaseNative();  // events and stream (the ring frees itself)

  Device* device_;
  size_t chunk_bytes_;
  int num_chunks_;
  std::vector<Buffer> chunks_;       // page-locked
  std::vector<void*> chunk_done_;    // cudaEvent_t: the chunk's last copy has landed
  std::vector<bool> chunk_pending_;  // its event was recorded since its last wait
  void* stream_ = nullptr;           // cudaStream_t, non-blocking
  int next_chunk_ = 0;
  size_t bytes_copied_ = 0;
};

}  // namespace mlag
