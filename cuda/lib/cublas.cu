#include "lib/cublas.h"

#include <climits>

#include "lib/library.h"

namespace accordion::cuda::cublas {

namespace {

void bind(void* handle, Api& a, std::string& missing) {
  bindSymbol(handle, a.create, "cublasCreate_v2", missing);
  bindSymbol(handle, a.destroy, "cublasDestroy_v2", missing);
  bindSymbol(handle, a.setStream, "cublasSetStream_v2", missing);
  bindSymbol(handle, a.setMathMode, "cublasSetMathMode", missing);
  bindSymbol(handle, a.getProperty, "cublasGetProperty", missing);
  bindSymbol(handle, a.getStatusString, "cublasGetStatusString", missing);
  bindSymbol(handle, a.sgemm, "cublasSgemm_v2", missing);
  bindSymbol(handle, a.sgemmStridedBatched, "cublasSgemmStridedBatched", missing);
  bindSymbol(handle, a.sgemmBatched, "cublasSgemmBatched", missing);
  bindSymbol(handle, a.gemmEx, "cublasGemmEx", missing);
}

std::string version(const Api& a) {
  int major = 0, minor = 0, patch = 0;
  a.getProperty(0, &major);
  a.getProperty(1, &minor);
  a.getProperty(2, &patch);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

RuntimeLibrary<Api>& library() {
  static RuntimeLibrary<Api> lib({"cuBLAS (libcublas.so.13)", "ACCORDION_CUBLAS",
                                  {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}, pipLibraryDirectories("cublas"),
                                  "cuBLAS 11.4 or later", bind, version});
  return lib;
}

}  // namespace

const Api& api() { return library().api(); }
LibraryStatus status() { return library().status(); }

void check(Status s, const char* what) {
  if (s != kSuccess)
    throw EngineError("ERR_CUBLAS", std::string(what) + " failed: " + api().getStatusString(s) + " (cuBLAS status " + std::to_string(s) + ")");
}

int dimension(int64_t size, const char* op, const char* name) {
  if (size < 0 || size > INT_MAX)
    throw invalidArgument(std::string(op) + " " + name + " " + std::to_string(size) + " lies outside cuBLAS's int range");
  return static_cast<int>(size);
}

}  // namespace accordion::cuda::cublas

namespace accordion::cuda {
LibraryStatus cublasStatus() { return cublas::status(); }
}  // namespace accordion::cuda
