// Loading NVIDIA's libraries at run time with dlopen, so the addon builds without their headers and
// loads on machines without them; each failure names every path tried.
#pragma once
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cuda.h"
#include "core/errors.h"

namespace accordion::cuda {

struct Library {
  void* handle = nullptr;
  std::string path;   // the file that loaded, as the loader resolved it
  std::string error;  // why nothing did: every path tried with the loader's reason
};

// Tries, in order: the file or directory named by the environment variable `envVar`; each of
// `names` through the dynamic loader's search path (LD_LIBRARY_PATH, the ld.so cache); each of
// `names` in the directories matching `directoryPatterns` (glob patterns, e.g. pip's
// site-packages/nvidia/*/lib).
Library openLibrary(const char* what, const char* envVar, const std::vector<std::string>& names,
                    const std::vector<std::string>& directoryPatterns);

// Where pip puts NVIDIA's wheels (nvidia-cudnn-cu13, nvidia-cublas, …), for `library` ("cudnn",
// "cublas", "nccl"): site-packages/nvidia/<library>/lib (the CUDA 12 wheels, and cuDNN and NCCL
// for CUDA 13), nvidia/cu13/lib and nvidia/cu12/lib (the CUDA 13 wheels' shared directory), in
// every Python environment found (system, user, virtual or conda environments, python3 on the PATH),
// then the CUDA toolkit's and the system's library directories.
std::vector<std::string> pipLibraryDirectories(const std::string& library);

// Looks up `symbol`, recording the first missing one in `missing`.
template <typename Fn>
void bindSymbol(void* handle, Fn& fn, const char* symbol, std::string& missing) {
  fn = reinterpret_cast<std::remove_reference_t<Fn>>(dlsym(handle, symbol));
  if (!fn && missing.empty()) missing = symbol;
}

}  // namespace accordion::cuda

namespace accordion::cuda {

// A library's table of functions, loaded and bound once, at first use.
template <typename Api>
class RuntimeLibrary {
 public:
  struct Spec {
    const char* what;     // for messages, e.g. "cuDNN (libcudnn.so.9)"
    const char* envVar;   // names its file or directory
    std::vector<std::string> names, directoryPatterns;
    const char* needs;    // the versions that have every symbol, for the message when one is missing
    void (*bind)(void* handle, Api& api, std::string& missing);
    std::string (*version)(const Api& api);
  };
  explicit RuntimeLibrary(Spec spec) : spec_(std::move(spec)) {}

  // The bound functions; throws EngineError ERR_CUDA_LIBRARY, naming every path tried, when the
  // library or one of its symbols is missing.
  const Api& api() {
    load();
    if (!status_.loaded) throw EngineError("ERR_CUDA_LIBRARY", status_.error);
    return api_;
  }
  LibraryStatus status() {
    load();
    return status_;
  }

 private:
  void load() {
    std::call_once(once_, [this] {
      Library lib = openLibrary(spec_.what, spec_.envVar, spec_.names, spec_.directoryPatterns);
      if (!lib.handle) {
        status_.error = lib.error;
        return;
      }
      std::string missing;
      spec_.bind(lib.handle, api_, missing);
      status_.path = lib.path;
      if (!missing.empty()) {
        status_.error = lib.path + " has no symbol " + missing + " (" + spec_.needs + " is needed)";
        return;
      }
      status_.version = spec_.version(api_);
      status_.loaded = true;
    });
  }
  Spec spec_;
  std::once_flag once_;
  Api api_{};
  LibraryStatus status_;
};

}  // namespace accordion::cuda
