#include "lib/nccl.h"

#include "lib/library.h"

namespace accordion::cuda::nccl {

namespace {

void bind(void* handle, Api& a, std::string& missing) {
  bindSymbol(handle, a.getVersion, "ncclGetVersion", missing);
  bindSymbol(handle, a.getErrorString, "ncclGetErrorString", missing);
  bindSymbol(handle, a.getUniqueId, "ncclGetUniqueId", missing);
  bindSymbol(handle, a.commInitRankConfig, "ncclCommInitRankConfig", missing);
  bindSymbol(handle, a.commFinalize, "ncclCommFinalize", missing);
  bindSymbol(handle, a.commDestroy, "ncclCommDestroy", missing);
  bindSymbol(handle, a.commAbort, "ncclCommAbort", missing);
  bindSymbol(handle, a.commGetAsyncError, "ncclCommGetAsyncError", missing);
  bindSymbol(handle, a.allReduce, "ncclAllReduce", missing);
  bindSymbol(handle, a.allGather, "ncclAllGather", missing);
  bindSymbol(handle, a.broadcast, "ncclBroadcast", missing);
}

// NCCL numbers versions major·10000 + minor·100 + patch (since 2.9).
std::string version(const Api& a) {
  int v = 0;
  a.getVersion(&v);
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

RuntimeLibrary<Api>& library() {
  static RuntimeLibrary<Api> lib({"NCCL (libnccl.so.2)", "ACCORDION_NCCL", {"libnccl.so.2", "libnccl.so"}, pipLibraryDirectories("nccl"),
                                  "NCCL 2.14 or later", bind, version});
  return lib;
}

}  // namespace

const Api& api() { return library().api(); }
LibraryStatus status() { return library().status(); }

}  // namespace accordion::cuda::nccl

namespace accordion::cuda {
LibraryStatus ncclStatus() { return nccl::status(); }
}  // namespace accordion::cuda
