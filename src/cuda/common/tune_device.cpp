// The tuner's view of a CUDA device (src/tune/device.h): cudaMalloc'd buffers, a stream of its
// own, and CUDA events around each timed call, as `fmha bench` times.
#include <cuda_runtime.h>

#include <string>

#include "tune/device.h"

namespace fmha::detail {
namespace {

void check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  cudaGetLastError();
  throw Error(Code::cuda_error, std::string("tuner: ") + what + ": " + cudaGetErrorString(error));
}

class CudaTuneDevice final : public TuneDevice {
 public:
  explicit CudaTuneDevice(int ordinal) : ordinal_(ordinal) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    check(cudaSetDevice(ordinal_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~CudaTuneDevice() override {
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
    cudaSetDevice(previous_);
  }
  void* allocate(size_t bytes) override {
    void* data = nullptr;
    check(cudaMalloc(&data, bytes > 0 ? bytes : 1), "cudaMalloc");
    return data;
  }
  void release(void* data) override { cudaFree(data); }
  void upload(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  void fill(void* dst, unsigned char value, size_t bytes) override {
    check(cudaMemsetAsync(dst, value, bytes, stream_), "cudaMemsetAsync");
  }
  void* stream() override { return stream_; }
  double time(const std::function<Status()>& run, Status* status) override {
    check(cudaEventRecord(start_, stream_), "cudaEventRecord");
    *status = run();
    check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return double(ms);
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  int ordinal_ = 0, previous_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

std::unique_ptr<TuneDevice> make_cuda_tune_device(int ordinal) { return std::make_unique<CudaTuneDevice>(ordinal); }

}  // namespace fmha::detail
