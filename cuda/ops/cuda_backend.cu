// The CUDA backend's device, streams, library handles and memory; the backend factory.
#include "ops/cuda_backend.h"

#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/current_device.h"

namespace accordion::cuda {

namespace {

// Host-to-device copies up to this size are staged through pinned memory and never wait; larger
// ones (state transfers, not the training step) wait for their copy instead of pinning more memory.
constexpr size_t kStagedUploadBytes = size_t{4} << 20;

void checkDevice(int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw EngineError("ERR_NO_CUDA_DEVICE", "no usable CUDA device: " + noDeviceReason(status));
  }
  if (count == 0) throw EngineError("ERR_NO_CUDA_DEVICE", "no CUDA device found");
  if (device < 0 || device >= count)
    throw EngineError("ERR_NO_CUDA_DEVICE", "there is no device cuda:" + std::to_string(device) + " (this machine has " +
                                                std::to_string(count) + ": cuda:0 to cuda:" + std::to_string(count - 1) + ")");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  if (prop.major < 8)
    throw EngineError("ERR_NO_CUDA_DEVICE", "cuda:" + std::to_string(device) + " (" + prop.name + ") has compute capability " +
                                                std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                                                "; the kernels are built for 8.0 and later");
}

}  // namespace

StreamContext::~StreamContext() {
  if (!stream) return;
  const DeviceScope scope(device);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}

void StreamContext::count(int64_t bytes) {
  const int64_t now = allocated.fetch_add(bytes) + bytes;
  int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

CudaBackend::CudaBackend(int device) : context_(std::make_shared<StreamContext>()) {
  checkDevice(device);
  // The libraries before any device state, so a missing one leaves nothing behind.
  const cudnn::Api& dnn = cudnn::api();
  const cublas::Api& blas = cublas::api();
  context_->device = device;
  check(useDevice(device), "cudaSetDevice");
  setProcessDevice(device);
  // From here on a failure (cuDNN's handle needs its sub-libraries, which it loads only now) must
  // not leave the copy stream or a handle behind: the destructor does not run for a constructor
  // that throws. The compute stream belongs to context_, which is destroyed either way.
  try {
    check(cudaStreamCreateWithFlags(&context_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(&copyStream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // Keep freed memory in the pool rather than returning it to the driver at every wait.
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
    uint64_t keepAll = std::numeric_limits<uint64_t>::max();
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keepAll), "cudaMemPoolSetAttribute");
    cudnn::check(dnn.create(&cudnn_), "cudnnCreate");
    cudnn::check(dnn.setStream(cudnn_, context_->stream), "cudnnSetStream");
    cublas::check(blas.create(&cublas_), "cublasCreate");
    cublas::check(blas.setStream(cublas_, context_->stream), "cublasSetStream");
    cublas::check(blas.setMathMode(cublas_, cublas::kDefaultMath), "cublasSetMathMode");
  } catch (...) {
    releaseHandles();
    throw;
  }
}

cublas::Handle CudaBackend::cublas(bool tf32) {
  const int math = tf32 ? cublas::kTf32Math : cublas::kDefaultMath;
  if (math != cublasMath_) {
    cublas::check(cublas::api().setMathMode(cublas_, math), "cublasSetMathMode");
    cublasMath_ = math;
  }
  return cublas_;
}

CudaBackend::~CudaBackend() {
  const DeviceScope scope(context_->device);
  cudaStreamSynchronize(copyStream_);
  cudaStreamSynchronize(context_->stream);
  releaseFinished();
  releaseHandles();
}

void CudaBackend::releaseHandles() {
  if (cublas_) cublas::api().destroy(cublas_);
  if (cudnn_) cudnn::api().destroy(cudnn_);
  if (copyStream_) cudaStreamDestroy(copyStream_);
  cublas_ = nullptr;
  cudnn_ = nullptr;
  copyStream_ = nullptr;
}

std::shared_ptr<void> CudaBackend::allocate(size_t bytes) {
  void* p = nullptr;
  const size_t rounded = std::max<size_t>(bytes, 1);
  const cudaError_t status = cudaMallocAsync(&p, rounded, context_->stream);
  if (status != cudaSuccess) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    throw EngineError("ERR_OUT_OF_MEMORY", "cannot allocate " + std::to_string(bytes) + " bytes on " + device().name() + " (" +
                                               cudaGetErrorString(status) + "; " + std::to_string(free >> 20) + " of " +
                                               std::to_string(total >> 20) + " MiB free)");
  }
  context_->count(static_cast<int64_t>(rounded));
  std::shared_ptr<StreamContext> context = context_;
  return std::shared_ptr<void>(p, [context, rounded](void* ptr) {
    const DeviceScope scope(context->device);  // the last reference may go on any thread
    cudaFreeAsync(ptr, context->stream);
    context->allocated -= static_cast<int64_t>(rounded);
  });
}

void CudaBackend::holdUntilDone(cudaStream_t stream, std::shared_ptr<const void> owner) {
  cudaEvent_t done;
  check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(done, stream), "cudaEventRecord");
  inFlight_.push_back({done, std::move(owner)});
}

void CudaBackend::releaseFinished() {
  while (!inFlight_.empty() && cudaEventQuery(inFlight_.front().done) == cudaSuccess) {
    cudaEventDestroy(inFlight_.front().done);
    inFlight_.pop_front();
  }
}

void CudaBackend::upload(void* dst, const void* hostSrc, size_t bytes) {
  if (!bytes) return;
  releaseFinished();
  if (bytes > kStagedUploadBytes) {
    check(cudaMemcpyAsync(dst, hostSrc, bytes, cudaMemcpyHostToDevice, context_->stream), "copy to the device");
    check(cudaStreamSynchronize(context_->stream), "copy to the device");
    return;
  }
  std::shared_ptr<void> staged = pinnedOn(context_->device, bytes);
  std::memcpy(staged.get(), hostSrc, bytes);
  check(cudaMemcpyAsync(dst, staged.get(), bytes, cudaMemcpyHostToDevice, context_->stream), "copy to the device");
  holdUntilDone(context_->stream, std::move(staged));
}

void CudaBackend::download(void* hostDst, const void* src, size_t bytes) {
  if (bytes) check(cudaMemcpyAsync(hostDst, src, bytes, cudaMemcpyDeviceToHost, context_->stream), "copy to the host");
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, context_->stream), "copy on the device");
}

std::shared_ptr<void> CudaBackend::uploadAhead(const void* hostSrc, size_t bytes, std::shared_ptr<const void> hostOwner) {
  releaseFinished();
  // Allocated in the copy stream's order; the compute stream's use and the free come after the
  // event it waits for, which the pool's stream ordering respects.
  void* p = nullptr;
  const size_t rounded = std::max<size_t>(bytes, 1);
  check(cudaMallocAsync(&p, rounded, copyStream_), "cudaMallocAsync");
  context_->count(static_cast<int64_t>(rounded));
  std::shared_ptr<StreamContext> context = context_;
  std::shared_ptr<void> memory(p, [context, rounded](void* ptr) {
    const DeviceScope scope(context->device);  // the last reference may go on any thread
    cudaFreeAsync(ptr, context->stream);
    context->allocated -= static_cast<int64_t>(rounded);
  });
  check(cudaMemcpyAsync(p, hostSrc, bytes, cudaMemcpyHostToDevice, copyStream_), "copy to the device");
  cudaEvent_t arrived;
  check(cudaEventCreateWithFlags(&arrived, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(arrived, copyStream_), "cudaEventRecord");
  check(cudaStreamWaitEvent(context_->stream, arrived, 0), "cudaStreamWaitEvent");
  inFlight_.push_back({arrived, std::move(hostOwner)});
  return memory;
}

void CudaBackend::synchronize() {
  check(cudaStreamSynchronize(context_->stream), "waiting for the device");
  releaseFinished();
}

void CudaBackend::uploadImages(const float* hostNchw, float* images, int64_t n, int64_t c, int64_t h, int64_t w) {
  const size_t bytes = static_cast<size_t>(n * c * h * w) * sizeof(float);
  if (!channelsLast()) return upload(images, hostNchw, bytes);
  const std::shared_ptr<void> staged = scratch(bytes);  // NCHW, then into the layout on the device
  upload(staged.get(), hostNchw, bytes);
  flattenBackward(static_cast<const float*>(staged.get()), images, n, c, h, w);
}


const void* CudaBackend::deviceTable(const void* host, size_t bytes) {
  const std::string content(static_cast<const char*>(host), bytes);
  for (auto it = tables_.begin(); it != tables_.end(); ++it)
    if (it->content == content) {
      if (it != tables_.begin()) {
        Table hit = std::move(*it);
        tables_.erase(it);
        tables_.push_front(std::move(hit));
      }
      return tables_.front().memory.get();
    }
  Table table{content, allocate(bytes)};
  upload(table.memory.get(), host, bytes);
  tables_.push_front(std::move(table));
  if (tables_.size() > 128) tables_.pop_back();  // freed in stream order, after any kernel that reads it
  return tables_.front().memory.get();
}

CompressionKernels& CudaBackend::compression() {
  if (!compression_) compression_ = std::make_unique<CudaCompressionKernels>(*this);
  return *compression_;
}

std::unique_ptr<Backend> makeBackend(int device) { return std::make_unique<CudaBackend>(device); }

std::optional<EngineError> unusable(int device) {
  try {
    checkDevice(device);
    cudnn::api();
    cublas::api();
  } catch (const EngineError& e) {
    return e;
  }
  // A job checks its worker's GPU before it assembles batches: their pinned memory belongs there.
  setProcessDevice(device);
  return std::nullopt;
}

}  // namespace accordion::cuda
