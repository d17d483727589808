// ProcessGroup over NCCL (lib/nccl.h, loaded at run time). The unique id travels through the job's
// rendezvous store, as in c10d. The communicator is created non-blocking, so that its set-up and
// every collective can be bounded by the job's timeout and aborted when a peer fails or hangs.
#include "comm/nccl_group.h"

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "core/check.h"
#include "core/current_device.h"
#include "lib/nccl.h"

namespace accordion::cuda {

// The group's device state. Its destructor also runs when the constructor fails (a set-up that
// times out), so nothing is left behind then either.
struct NcclGroup::Impl {
  int device = 0;
  nccl::Comm comm = nullptr;
  cudaStream_t stream = nullptr;
  float* one = nullptr;  // the barrier's all-reduce
  ~Impl() {
    if (!one && !stream) return;  // never touched the device (a failed check): make no context now
    const DeviceScope scope(device);
    if (one) cudaFree(one);
    if (stream) cudaStreamDestroy(stream);
  }
};

namespace {

std::string gpuOf(int device) {
  char busId[32] = {0};
  check(cudaDeviceGetPCIBusId(busId, sizeof(busId), device), "cudaDeviceGetPCIBusId");
  return busId;
}

}  // namespace

NcclGroup::NcclGroup(StoreClient& store, const NcclOptions& options) : options_(options), impl_(std::make_unique<Impl>()) {
  const nccl::Api& api = nccl::api();
  const std::string who = "rank " + std::to_string(options.rank);
  int devices = 0;
  check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (options.device < 0 || options.device >= devices)
    throw EngineError("ERR_NO_CUDA_DEVICE", who + " needs GPU " + std::to_string(options.device) + " but " +
                                                (options.hostname.empty() ? "this host" : options.hostname) + " has " +
                                                std::to_string(devices) + ": NCCL runs one rank per GPU, so start at most " +
                                                std::to_string(devices) + " workers per host");
  check(useDevice(options.device), "cudaSetDevice");
  setProcessDevice(options.device);
  impl_->device = options.device;

  // Every rank's host and GPU, so that two ranks on one GPU are named before NCCL refuses them.
  const std::string key = "nccl/" + options.prefix + "/";
  const std::string mine = options.hostname + " " + gpuOf(options.device);
  store.set(key + "gpu/" + std::to_string(options.rank), std::vector<char>(mine.begin(), mine.end()));
  std::map<std::string, int> owner;
  for (int r = 0; r < options.size; ++r) {
    const std::vector<char> bytes = store.get(key + "gpu/" + std::to_string(r), options.timeout);
    const std::string gpu(bytes.begin(), bytes.end());
    const auto [it, fresh] = owner.emplace(gpu, r);
    if (!fresh)
      throw EngineError("ERR_NO_CUDA_DEVICE", "ranks " + std::to_string(it->second) + " and " + std::to_string(r) + " both use GPU " + gpu +
                                                  ": NCCL runs one rank per GPU (set a distinct LOCAL_RANK per worker of a host, "
                                                  "and at most as many workers per host as it has GPUs)");
  }

  nccl::UniqueId id{};
  if (options.rank == 0) {
    const nccl::Result r = api.getUniqueId(&id);
    if (r != nccl::kSuccess) throw EngineError("ERR_COLLECTIVE", std::string("ncclGetUniqueId failed: ") + api.getErrorString(r));
    store.set(key + "unique-id", std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    const std::vector<char> bytes = store.get(key + "unique-id", options.timeout);
    if (bytes.size() != sizeof(id.internal)) throw EngineError("ERR_RENDEZVOUS", "the NCCL unique id in the store has the wrong size");
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaMalloc(&impl_->one, sizeof(float)), "cudaMalloc");
  nccl::Config config;
  config.blocking = 0;
  enqueued(api.commInitRankConfig(&impl_->comm, options.size, id, options.rank, &config), "ncclCommInitRankConfig");
  wait("the NCCL communicator's set-up (" + std::to_string(options.size) + " ranks)");
}

NcclGroup::~NcclGroup() {
  // The last reference to the group may go on any thread: its GPU first.
  const DeviceScope scope(options_.device);
  if (impl_->comm) finalizeAndDestroy();
}  // then impl_ frees the barrier's float and the stream

// A non-blocking communicator is finalised before it is destroyed: ncclCommFinalize flushes what is
// still queued and answers ncclInProgress, and ncclCommGetAsyncError says when it is done. Waiting is
// bounded by the job's timeout, after which (or on an error) the communicator is aborted instead.
void NcclGroup::finalizeAndDestroy() noexcept {
  try {
    const nccl::Api& api = nccl::api();
    const nccl::Comm comm = impl_->comm;
    impl_->comm = nullptr;
    nccl::Result state = api.commFinalize(comm);
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    while (state == nccl::kInProgress && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (api.commGetAsyncError(comm, &state) != nccl::kSuccess) break;
    }
    if (state == nccl::kSuccess)
      api.commDestroy(comm);
    else
      api.commAbort(comm);
  } catch (...) {  // nccl::api() loaded before the communicator existed; nothing else throws
  }
}

void NcclGroup::abort(const std::string& message) {
  if (impl_->comm) nccl::api().commAbort(impl_->comm);
  impl_->comm = nullptr;
  throw EngineError("ERR_COLLECTIVE", message);
}

nccl::Comm NcclGroup::live(const std::string& what) {
  if (!impl_->comm) throw EngineError("ERR_COLLECTIVE", what + " on rank " + std::to_string(options_.rank) +
                                                            ": the NCCL communicator was aborted by an earlier failure");
  return impl_->comm;
}

void NcclGroup::enqueued(int result, const std::string& what) {
  if (result != nccl::kSuccess && result != nccl::kInProgress)
    abort(what + " failed on rank " + std::to_string(options_.rank) + ": " + nccl::api().getErrorString(result));
}

void NcclGroup::wait(const std::string& what) {
  const nccl::Comm comm = live(what);
  const nccl::Api& api = nccl::api();
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  const std::string where = " on rank " + std::to_string(options_.rank);
  auto overdue = [&] {
    if (std::chrono::steady_clock::now() > deadline)
      abort(what + " timed out after " + std::to_string(options_.timeout.count()) + " ms" + where + " (a peer failed or stopped answering)");
  };
  // NCCL's own progress: the set-up, or the enqueueing of a collective.
  while (true) {
    nccl::Result state = nccl::kSuccess;
    api.commGetAsyncError(comm, &state);
    if (state == nccl::kSuccess) break;
    if (state != nccl::kInProgress) abort(what + " failed" + where + ": " + api.getErrorString(state));
    overdue();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // The collective on the stream; a peer's failure shows as an asynchronous error meanwhile.
  while (true) {
    const cudaError_t status = cudaStreamQuery(impl_->stream);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check(status, (what + where).c_str());
    nccl::Result state = nccl::kSuccess;
    api.commGetAsyncError(comm, &state);
    if (state != nccl::kSuccess && state != nccl::kInProgress) abort(what + " failed" + where + ": " + api.getErrorString(state));
    overdue();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclGroup::allReduceSum(float* data, int64_t count) {
  if (count == 0) return;
  const std::string what = "all-reduce of " + std::to_string(count) + " floats";
  enqueued(nccl::api().allReduce(data, data, static_cast<size_t>(count), nccl::kFloat32, nccl::kSum, live(what), impl_->stream), what);
  wait(what);
  if (size() > 1) record(Collective::AllReduce, count);
}

void NcclGroup::allGather(const float* input, int64_t count, float* output) {
  if (count == 0) return;
  const std::string what = "all-gather of " + std::to_string(count) + " floats per rank";
  enqueued(nccl::api().allGather(input, output, static_cast<size_t>(count), nccl::kFloat32, live(what), impl_->stream), what);
  wait(what);
  if (size() > 1) record(Collective::AllGather, count * size());
}

void NcclGroup::broadcast(float* data, int64_t count, int root) {
  if (count == 0) return;
  const std::string what = "broadcast of " + std::to_string(count) + " floats from rank " + std::to_string(root);
  enqueued(nccl::api().broadcast(data, data, static_cast<size_t>(count), nccl::kFloat32, root, live(what), impl_->stream), what);
  wait(what);
  if (size() > 1) record(Collective::Broadcast, count);
}

// A one-float all-reduce: NCCL has no barrier of its own (so it counts as an all-reduce of one float).
void NcclGroup::barrier() { allReduceSum(impl_->one, 1); }

std::shared_ptr<ProcessGroup> makeNcclGroup(StoreClient& store, const NcclOptions& options) {
  return std::make_shared<NcclGroup>(store, options);
}

}  // namespace accordion::cuda
