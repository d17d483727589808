#include <glob.h>
#include <link.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>

#include "lib/library.h"

namespace accordion::cuda {

namespace {

bool isDirectory(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::vector<std::string> expand(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t matches{};
  if (glob(pattern.c_str(), 0, nullptr, &matches) == 0)
    for (size_t i = 0; i < matches.gl_pathc; ++i) out.push_back(matches.gl_pathv[i]);
  globfree(&matches);
  return out;
}

// Where Python keeps its packages: the system's and pip's usual prefixes, the user's, an active
// virtual environment or conda environment, and the environment of every python3 on the PATH
// (a venv's bin/python3 sits beside its lib/python3.X/site-packages), as glob patterns.
std::vector<std::string> pythonPackageRoots() {
  std::vector<std::string> roots = {"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                                    "/usr/lib/python3/dist-packages",        "/usr/lib/python3*/site-packages",
                                    "/opt/*/lib/python3*/site-packages",     "/opt/*/.venv/lib/python3*/site-packages",
                                    "/opt/conda/envs/*/lib/python3*/site-packages"};
  if (const char* home = std::getenv("HOME"); home && *home) roots.push_back(std::string(home) + "/.local/lib/python3*/site-packages");
  for (const char* prefix : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const char* dir = std::getenv(prefix); dir && *dir) roots.push_back(std::string(dir) + "/lib/python3*/site-packages");
  if (const char* path = std::getenv("PATH")) {
    std::string entries = path;
    for (size_t start = 0; start <= entries.size();) {
      const size_t end = std::min(entries.find(':', start), entries.size());
      const std::string dir = entries.substr(start, end - start);
      start = end + 1;
      if (dir.empty() || dir == "/usr/bin" || dir == "/bin" || dir == "/usr/local/bin") continue;  // covered above
      struct stat info {};
      if (stat((dir + "/python3").c_str(), &info) == 0) roots.push_back(dir + "/../lib/python3*/site-packages");
    }
  }
  std::vector<std::string> unique;
  for (const std::string& r : roots)
    if (std::find(unique.begin(), unique.end(), r) == unique.end()) unique.push_back(r);
  return unique;
}

}  // namespace

std::vector<std::string> pipLibraryDirectories(const std::string& library) {
  // The CUDA 12 wheels put each library in nvidia/<library>/lib; the CUDA 13 ones gather the
  // toolkit's libraries (cuBLAS among them) in nvidia/cu13/lib, while cuDNN and NCCL keep their own.
  const std::vector<std::string> tails = {"/nvidia/" + library + "/lib", "/nvidia/cu13/lib", "/nvidia/cu12/lib"};
  std::vector<std::string> out;
  for (const std::string& root : pythonPackageRoots())
    for (const std::string& tail : tails) out.push_back(root + tail);
  out.push_back("/usr/local/cuda/lib64");
  out.push_back("/usr/lib/x86_64-linux-gnu");
  return out;
}

Library openLibrary(const char* what, const char* envVar, const std::vector<std::string>& names,
                    const std::vector<std::string>& directoryPatterns) {
  Library lib;
  std::string tried;
  std::vector<std::string> seen;  // a directory can match two patterns (a venv that is also on the PATH)
  auto attempt = [&](const std::string& path) {
    if (lib.handle || std::find(seen.begin(), seen.end(), path) != seen.end()) return;
    seen.push_back(path);
    // RTLD_GLOBAL: cuDNN's front library opens its sub-libraries, which resolve against it.
    lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (lib.handle) {
      // The file the loader chose: a bare soname resolves through LD_LIBRARY_PATH or the ld.so cache.
      link_map* map = nullptr;
      lib.path = dlinfo(lib.handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name ? map->l_name : path;
      return;
    }
    // dlerror() names the file itself, usually first.
    std::string why = dlerror() ?: "not loadable";
    if (why.rfind(path + ": ", 0) == 0) why.erase(0, path.size() + 2);
    tried += "\n  " + path + ": " + why;
  };
  if (const char* configured = std::getenv(envVar); configured && *configured) {
    const std::string base = configured;
    if (isDirectory(base))
      for (const auto& name : names) attempt(base + "/" + name);
    else
      attempt(base);
  }
  for (const auto& name : names) attempt(name);
  for (const auto& pattern : directoryPatterns)
    for (const auto& dir : expand(pattern))
      for (const auto& name : names) attempt(dir + "/" + name);
  if (!lib.handle)
    lib.error = std::string(what) + " could not be loaded; set " + envVar +
                " to its file or directory (e.g. pip's site-packages/nvidia/.../lib), or add that directory to LD_LIBRARY_PATH. Tried:" +
                tried;
  return lib;
}

}  // namespace accordion::cuda
