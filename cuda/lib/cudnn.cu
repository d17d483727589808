#include "lib/cudnn.h"

#include <mutex>

#include "core/errors.h"
#include "lib/library.h"

namespace accordion::cuda::cudnn {

namespace {

struct Loaded {
  Api api{};
  LibraryStatus status;
};

const Loaded& loaded() {
  static Loaded result;
  static std::once_flag once;
  std::call_once(once, [] {
    Library lib = openLibrary("cuDNN (libcudnn.so.9)", "ACCORDION_CUDNN", {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"},
                              pipLibraryDirectories("cudnn"));
    if (!lib.handle) {
      result.status.error = lib.error;
      return;
    }
    Api& a = result.api;
    std::string missing;
    bindSymbol(lib.handle, a.getVersion, "cudnnGetVersion", missing);
    bindSymbol(lib.handle, a.getErrorString, "cudnnGetErrorString", missing);
    bindSymbol(lib.handle, a.create, "cudnnCreate", missing);
    bindSymbol(lib.handle, a.destroy, "cudnnDestroy", missing);
    bindSymbol(lib.handle, a.setStream, "cudnnSetStream", missing);
    bindSymbol(lib.handle, a.createTensorDescriptor, "cudnnCreateTensorDescriptor", missing);
    bindSymbol(lib.handle, a.destroyTensorDescriptor, "cudnnDestroyTensorDescriptor", missing);
    bindSymbol(lib.handle, a.setTensor4dDescriptor, "cudnnSetTensor4dDescriptor", missing);
    bindSymbol(lib.handle, a.createFilterDescriptor, "cudnnCreateFilterDescriptor", missing);
    bindSymbol(lib.handle, a.destroyFilterDescriptor, "cudnnDestroyFilterDescriptor", missing);
    bindSymbol(lib.handle, a.setFilter4dDescriptor, "cudnnSetFilter4dDescriptor", missing);
    bindSymbol(lib.handle, a.createConvolutionDescriptor, "cudnnCreateConvolutionDescriptor", missing);
    bindSymbol(lib.handle, a.destroyConvolutionDescriptor, "cudnnDestroyConvolutionDescriptor", missing);
    bindSymbol(lib.handle, a.setConvolution2dDescriptor, "cudnnSetConvolution2dDescriptor", missing);
    bindSymbol(lib.handle, a.setConvolutionMathType, "cudnnSetConvolutionMathType", missing);
    bindSymbol(lib.handle, a.findConvolutionForwardAlgorithm, "cudnnFindConvolutionForwardAlgorithm", missing);
    bindSymbol(lib.handle, a.findConvolutionBackwardDataAlgorithm, "cudnnFindConvolutionBackwardDataAlgorithm", missing);
    bindSymbol(lib.handle, a.findConvolutionBackwardFilterAlgorithm, "cudnnFindConvolutionBackwardFilterAlgorithm", missing);
    bindSymbol(lib.handle, a.convolutionForward, "cudnnConvolutionForward", missing);
    bindSymbol(lib.handle, a.convolutionBackwardData, "cudnnConvolutionBackwardData", missing);
    bindSymbol(lib.handle, a.convolutionBackwardFilter, "cudnnConvolutionBackwardFilter", missing);
    result.status.path = lib.path;
    if (!missing.empty()) {
      result.status.error = lib.path + " has no symbol " + missing + " (cuDNN 8 or 9 is needed)";
      return;
    }
    // cuDNN 9 numbers versions major·10000 + minor·100 + patch, cuDNN 8 major·1000 + minor·100 + patch.
    const size_t v = a.getVersion();
    const size_t major = v >= 90000 ? v / 10000 : v / 1000, minor = v >= 90000 ? v / 100 % 100 : v / 100 % 10, patch = v % 100;
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
    throw EngineError("ERR_CUDNN", std::string(what) + " failed: " + api().getErrorString(s) + " (cuDNN status " + std::to_string(s) + ")");
}

}  // namespace accordion::cuda::cudnn

namespace accordion::cuda {
LibraryStatus cudnnStatus() { return cudnn::status(); }
}  // namespace accordion::cuda
