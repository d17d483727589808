#include "lib/cublas.h"

#include <mutex>

#include "core/errors.h"
#include "lib/library.h"

namespace accordion::cuda::cublas {

namespace {

struct Loaded {
  Api api{};
  LibraryStatus status;
};

const Loaded& loaded() {
  static Loaded result;
  static std::once_flag once;
  std::call_once(once, [] {
    Library lib = openLibrary("cuBLAS (libcublas.so.13)", "ACCORDION_CUBLAS",
                              {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}, pipLibraryDirectories("cublas"));
    if (!lib.handle) {
      result.status.error = lib.error;
      return;
    }
    Api& a = result.api;
    std::string missing;
    bindSymbol(lib.handle, a.create, "cublasCreate_v2", missing);
    bindSymbol(lib.handle, a.destroy, "cublasDestroy_v2", missing);
    bindSymbol(lib.handle, a.setStream, "cublasSetStream_v2", missing);
    bindSymbol(lib.handle, a.setMathMode, "cublasSetMathMode", missing);
    bindSymbol(lib.handle, a.getProperty, "cublasGetProperty", missing);
    bindSymbol(lib.handle, a.getStatusString, "cublasGetStatusString", missing);
    bindSymbol(lib.handle, a.sgemm, "cublasSgemm_v2", missing);
    bindSymbol(lib.handle, a.sgemmStridedBatched, "cublasSgemmStridedBatched", missing);
    result.status.path = lib.path;
    if (!missing.empty()) {
      result.status.error = lib.path + " has no symbol " + missing + " (cuBLAS 11.4 or later is needed)";
      return;
    }
    int major = 0, minor = 0, patch = 0;
    a.getProperty(0, &major);
    a.getProperty(1, &minor);
    a.getProperty(2, &patch);
    result.status.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
    result.status.loaded = true;
  });
  return result;
}

}  // namespace

const Api& api() {
  const Loaded& l = loaded();
  if (!l.status.loaded) throw EngineError("ERR_CUDA_LIBRARY", l.status.error);
  return l.api;
}

LibraryStatus status() { return loaded().status; }

void check(Status s, const char* what) {
  if (s != kSuccess)
    throw EngineError("ERR_CUBLAS", std::string(what) + " failed: " + api().getStatusString(s) + " (cuBLAS status " + std::to_string(s) + ")");
}

}  // namespace accordion::cuda::cublas

namespace accordion::cuda {
LibraryStatus cublasStatus() { return cublas::status(); }
}  // namespace accordion::cuda
