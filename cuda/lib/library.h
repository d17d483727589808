// Loading NVIDIA's libraries at run time with dlopen, so the addon builds without their headers and
// loads on machines without them; each failure names every path tried.
#pragma once
#include <dlfcn.h>

#include <string>
#include <type_traits>
#include <vector>

namespace accordion::cuda {

struct Library {
  void* handle = nullptr;
  std::string path;   // what loaded
  std::string error;  // why nothing did: every path tried with the loader's reason
};

// Tries, in order: the file or directory named by the environment variable `envVar`; each of
// `names` through the dynamic loader's search path (LD_LIBRARY_PATH, the ld.so cache); each of
// `names` in the directories matching `directoryPatterns` (glob patterns, e.g. pip's
// site-packages/nvidia/*/lib).
Library openLibrary(const char* what, const char* envVar, const std::vector<std::string>& names,
                    const std::vector<std::string>& directoryPatterns);

// Where pip puts NVIDIA's wheels (nvidia-cudnn-cu13, nvidia-cublas, …), for `library` ("cudnn", "cublas").
std::vector<std::string> pipLibraryDirectories(const std::string& library);

// Looks up `symbol`, recording the first missing one in `missing`.
template <typename Fn>
void bindSymbol(void* handle, Fn& fn, const char* symbol, std::string& missing) {
  fn = reinterpret_cast<std::remove_reference_t<Fn>>(dlsym(handle, symbol));
  if (!fn && missing.empty()) missing = symbol;
}

}  // namespace accordion::cuda
