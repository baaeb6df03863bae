// What the tuner needs of a device: memory, copies and a timer. The CPU's is here; the CUDA one
// lives with the CUDA code (src/cuda/common/tune_device.cpp) so that the tuner itself compiles
// without the CUDA toolkit. Failures throw fmha::Error.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "fmha/fmha.h"

namespace fmha::detail {

class TuneDevice {
 public:
  virtual ~TuneDevice() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* data) = 0;
  virtual void upload(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual void fill(void* device_dst, unsigned char value, size_t bytes) = 0;
  // The stream the calls run on (nullptr on the CPU).
  virtual void* stream() = 0;
  // Milliseconds `run` takes: CUDA events around it on the stream, the wall clock on the CPU.
  virtual double time(const std::function<Status()>& run, Status* status) = 0;
  virtual void synchronize() = 0;
};

std::unique_ptr<TuneDevice> make_cpu_tune_device();
// nullptr in a build without CUDA.
std::unique_ptr<TuneDevice> make_cuda_tune_device(int ordinal);

}  // namespace fmha::detail
