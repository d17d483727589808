// ProcessGroup over NCCL for device memory. libnccl.so.2 is loaded with dlopen at first use (no NCCL
// headers or link-time dependency): the few functions and types used are declared here, with the
// ABI of NCCL 2.x. The unique id travels through the job's rendezvous store, as in c10d.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "core/cuda.h"
#include "core/errors.h"
#include "comm/nccl_group.h"

namespace accordion::cuda {

namespace {

// From nccl.h (NCCL 2.x): opaque communicator, 128-byte unique id, result and type enums.
using ncclComm_t = struct ncclComm*;
struct ncclUniqueId {
  char internal[128];
};
using ncclResult_t = int;
constexpr ncclResult_t ncclSuccess = 0, ncclInProgress = 7;
constexpr int ncclFloat32 = 7;
constexpr int ncclSum = 0;

struct NcclApi {
  ncclResult_t (*getUniqueId)(ncclUniqueId*);
  ncclResult_t (*commInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*commDestroy)(ncclComm_t);
  ncclResult_t (*commAbort)(ncclComm_t);
  ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*allReduce)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*allGather)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*broadcast)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
  const char* (*getErrorString)(ncclResult_t);
};

const NcclApi& api() {
  static std::once_flag once;
  static NcclApi table{};
  static std::string failure;
  std::call_once(once, [] {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      const char* why = dlerror();
      failure = std::string("libnccl.so.2 could not be loaded (") + (why ? why : "unknown reason") +
                "); install NCCL (Debian libnccl2, or the nvidia-nccl pip wheel with its directory on LD_LIBRARY_PATH)";
      return;
    }
    auto bind = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && failure.empty()) failure = std::string("libnccl.so.2 has no symbol ") + name;
    };
    bind(table.getUniqueId, "ncclGetUniqueId");
    bind(table.commInitRank, "ncclCommInitRank");
    bind(table.commDestroy, "ncclCommDestroy");
    bind(table.commAbort, "ncclCommAbort");
    bind(table.commGetAsyncError, "ncclCommGetAsyncError");
    bind(table.allReduce, "ncclAllReduce");
    bind(table.allGather, "ncclAllGather");
    bind(table.broadcast, "ncclBroadcast");
    bind(table.getErrorString, "ncclGetErrorString");
  });
  if (!failure.empty()) throw EngineError("ERR_NCCL_MISSING", failure);
  return table;
}

void check(ncclResult_t result, const std::string& what) {
  if (result != ncclSuccess) throw EngineError("ERR_COLLECTIVE", what + " failed: " + api().getErrorString(result));
}

void checkCuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw EngineError("ERR_CUDA", what + " failed: " + cudaGetErrorString(status));
}

}  // namespace

std::string ncclStatus() {
  try {
    api();
    return "";
  } catch (const EngineError& e) {
    return e.what();
  }
}

struct NcclGroup::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

NcclGroup::NcclGroup(StoreClient& store, int rank, int size, int device, std::chrono::milliseconds timeout, const std::string& prefix)
    : rank_(rank), size_(size), timeout_(timeout), impl_(std::make_unique<Impl>()) {
  const NcclApi& nccl = api();
  checkCuda(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id{};
  const std::string key = "nccl/" + prefix + "/unique-id";
  if (rank == 0) {
    check(nccl.getUniqueId(&id), "ncclGetUniqueId");
    store.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    std::vector<char> bytes = store.get(key, timeout);
    if (bytes.size() != sizeof(id.internal)) throw EngineError("ERR_RENDEZVOUS", "the NCCL unique id in the store has the wrong size");
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  checkCuda(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(nccl.commInitRank(&impl_->comm, size, id, rank), "ncclCommInitRank (rank " + std::to_string(rank) + ")");
}

NcclGroup::~NcclGroup() {
  if (impl_->comm) api().commDestroy(impl_->comm);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

// Waits for the stream with the group's timeout; a hung peer aborts the communicator instead of
// blocking forever.
void NcclGroup::wait(const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    const cudaError_t status = cudaStreamQuery(impl_->stream);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) checkCuda(status, what);
    ncclResult_t async = ncclSuccess;
    api().commGetAsyncError(impl_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      api().commAbort(impl_->comm);
      impl_->comm = nullptr;
      check(async, what + " on rank " + std::to_string(rank_));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      api().commAbort(impl_->comm);
      impl_->comm = nullptr;
      throw EngineError("ERR_COLLECTIVE", what + " timed out after " + std::to_string(timeout_.count()) + " ms on rank " +
                                              std::to_string(rank_));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclGroup::allReduceSum(float* data, int64_t count) {
  if (size_ == 1 || count == 0) return;
  check(api().allReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, impl_->comm, impl_->stream), "ncclAllReduce");
  wait("all-reduce of " + std::to_string(count) + " floats");
}

void NcclGroup::allGather(const float* input, int64_t count, float* output) {
  if (count == 0) return;
  check(api().allGather(input, output, static_cast<size_t>(count), ncclFloat32, impl_->comm, impl_->stream), "ncclAllGather");
  wait("all-gather of " + std::to_string(count) + " floats per rank");
}

void NcclGroup::broadcast(float* data, int64_t count, int root) {
  if (size_ == 1 || count == 0) return;
  check(api().broadcast(data, data, static_cast<size_t>(count), ncclFloat32, root, impl_->comm, impl_->stream), "ncclBroadcast");
  wait("broadcast of " + std::to_string(count) + " floats");
}

void NcclGroup::barrier() {
  // A one-float all-reduce through the communicator: NCCL has no barrier of its own.
  float* one = nullptr;
  checkCuda(cudaMalloc(&one, sizeof(float)), "cudaMalloc");
  try {
    allReduceSum(one, 1);
  } catch (...) {
    cudaFree(one);
    throw;
  }
  cudaFree(one);
}

}  // namespace accordion::cuda
