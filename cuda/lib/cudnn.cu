#include "lib/cudnn.h"

#include "lib/library.h"

namespace accordion::cuda::cudnn {

namespace {

void bind(void* handle, Api& a, std::string& missing) {
  bindSymbol(handle, a.getVersion, "cudnnGetVersion", missing);
  bindSymbol(handle, a.getErrorString, "cudnnGetErrorString", missing);
  bindSymbol(handle, a.create, "cudnnCreate", missing);
  bindSymbol(handle, a.destroy, "cudnnDestroy", missing);
  bindSymbol(handle, a.setStream, "cudnnSetStream", missing);
  bindSymbol(handle, a.createTensorDescriptor, "cudnnCreateTensorDescriptor", missing);
  bindSymbol(handle, a.destroyTensorDescriptor, "cudnnDestroyTensorDescriptor", missing);
  bindSymbol(handle, a.setTensor4dDescriptor, "cudnnSetTensor4dDescriptor", missing);
  bindSymbol(handle, a.createFilterDescriptor, "cudnnCreateFilterDescriptor", missing);
  bindSymbol(handle, a.destroyFilterDescriptor, "cudnnDestroyFilterDescriptor", missing);
  bindSymbol(handle, a.setFilter4dDescriptor, "cudnnSetFilter4dDescriptor", missing);
  bindSymbol(handle, a.createConvolutionDescriptor, "cudnnCreateConvolutionDescriptor", missing);
  bindSymbol(handle, a.destroyConvolutionDescriptor, "cudnnDestroyConvolutionDescriptor", missing);
  bindSymbol(handle, a.setConvolution2dDescriptor, "cudnnSetConvolution2dDescriptor", missing);
  bindSymbol(handle, a.setConvolutionMathType, "cudnnSetConvolutionMathType", missing);
  bindSymbol(handle, a.findConvolutionForwardAlgorithm, "cudnnFindConvolutionForwardAlgorithm", missing);
  bindSymbol(handle, a.findConvolutionBackwardDataAlgorithm, "cudnnFindConvolutionBackwardDataAlgorithm", missing);
  bindSymbol(handle, a.findConvolutionBackwardFilterAlgorithm, "cudnnFindConvolutionBackwardFilterAlgorithm", missing);
  bindSymbol(handle, a.convolutionForward, "cudnnConvolutionForward", missing);
  bindSymbol(handle, a.convolutionBackwardData, "cudnnConvolutionBackwardData", missing);
  bindSymbol(handle, a.convolutionBackwardFilter, "cudnnConvolutionBackwardFilter", missing);
}

// cuDNN 9 numbers versions major·10000 + minor·100 + patch, cuDNN 8 major·1000 + minor·100 + patch.
std::string version(const Api& a) {
  const size_t v = a.getVersion();
  const size_t major = v >= 90000 ? v / 10000 : v / 1000, minor = v >= 90000 ? v / 100 % 100 : v / 100 % 10, patch = v % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

RuntimeLibrary<Api>& library() {
  static RuntimeLibrary<Api> lib({"cuDNN (libcudnn.so.9)", "ACCORDION_CUDNN", {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"},
                                  pipLibraryDirectories("cudnn"), "cuDNN 8 or 9", bind, version});
  return lib;
}

}  // namespace

const Api& api() { return library().api(); }
LibraryStatus status() { return library().status(); }

void check(Status s, const char* what) {
  if (s != kSuccess)
    throw EngineError("ERR_CUDNN", std::string(what) + " failed: " + api().getErrorString(s) + " (cuDNN status " + std::to_string(s) + ")");
}

}  // namespace accordion::cuda::cudnn

namespace accordion::cuda {
LibraryStatus cudnnStatus() { return cudnn::status(); }
}  // namespace accordion::cuda
