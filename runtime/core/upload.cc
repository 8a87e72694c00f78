#include "runtime/core/upload.h"

#include <algorithm>
#include <cstring>

#include "mlag_config.h"
#include "runtime/core/cuda_status.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mlag {

Uploader::Uploader(Device* device, size_t chunk_bytes, int chunks)
    : device_(device),
      chunk_bytes_(std::max<size_t>(chunk_bytes, 4096)),
      num_chunks_(std::max(chunks, 2)) {}

Uploader::~Uploader() {
  Finish().IgnoreError();
  ReleaseNative();
}

absl::Status Uploader::Start() {
#if MLAG_HAVE_CUDA
  MLAG_RETURN_IF_ERROR(device_->MakeCurrent());
  cudaStream_t s = nullptr;
  MLAG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  for (int i = 0; i < num_chunks_; ++i) {
    MLAG_ASSIGN_OR_RETURN(Buffer chunk, device_->AllocatePinned(chunk_bytes_));
    chunks_.push_back(std::move(chunk));
    cudaEvent_t e = nullptr;
    MLAG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    chunk_done_.push_back(e);
    chunk_pending_.push_back(false);
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("CUDA upload in a build without CUDA");
#endif
}

void Uploader::ReleaseNative() {
#if MLAG_HAVE_CUDA
  for (void* e : chunk_done_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  chunk_done_.clear();
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  stream_ = nullptr;
#endif
}

absl::Status Uploader::Copy(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  bytes_copied_ += bytes;
  if (!device_->is_cuda()) {
    std::memcpy(device_dst, host_src, bytes);
    return absl::OkStatus();
  }
#if MLAG_HAVE_CUDA
  if (stream_ == nullptr) {
    const absl::Status started = Start();
    if (!started.ok()) {
      ReleaseNative();
      chunks_.clear();
      chunk_pending_.clear();
      return started;
    }
  }
  MLAG_RETURN_IF_ERROR(device_->MakeCurrent());
  const char* src = static_cast<const char*>(host_src);
  char* dst = static_cast<char*>(device_dst);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(chunk_bytes_, bytes - done);
    const int c = next_chunk_;
    next_chunk_ = (next_chunk_ + 1) % num_chunks_;
    cudaEvent_t landed = static_cast<cudaEvent_t>(chunk_done_[c]);
    if (chunk_pending_[c]) {
      // The chunk's previous copy must have left it before it is refilled.
      MLAG_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(landed));
      chunk_pending_[c] = false;
    }
    std::memcpy(chunks_[c].data(), src + done, n);
    cudaStream_t s = static_cast<cudaStream_t>(stream_);
    MLAG_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst + done, chunks_[c].data(), n, cudaMemcpyHostToDevice, s));
    MLAG_CUDA_RETURN_IF_ERROR(cudaEventRecord(landed, s));
    chunk_pending_[c] = true;
    done += n;
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("CUDA upload in a build without CUDA");
#endif
}

absl::Status Uploader::Finish() {
#if MLAG_HAVE_CUDA
  if (stream_ == nullptr) return absl::OkStatus();
  MLAG_RETURN_IF_ERROR(device_->MakeCurrent());
  // A host-side wait: every stream launched after this returns sees the bytes.
  MLAG_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  std::fill(chunk_pending_.begin(), chunk_pending_.end(), false);
#endif
  return absl::OkStatus();
}

}  // namespace mlag
