#include <glob.h>
#include <sys/stat.h>

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

}  // namespace

std::vector<std::string> pipLibraryDirectories(const std::string& library) {
  const std::string tail = "/nvidia/" + library + "/lib";
  std::vector<std::string> out;
  for (const char* root : {"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                           "/usr/lib/python3/dist-packages", "/opt/*/.venv/lib/python3*/site-packages",
                           "/opt/conda/lib/python3*/site-packages"})
    out.push_back(root + tail);
  if (const char* home = std::getenv("HOME")) out.push_back(std::string(home) + "/.local/lib/python3*/site-packages" + tail);
  out.push_back("/usr/local/cuda/lib64");
  out.push_back("/usr/lib/x86_64-linux-gnu");
  return out;
}

Library openLibrary(const char* what, const char* envVar, const std::vector<std::string>& names,
                    const std::vector<std::string>& directoryPatterns) {
  Library lib;
  std::string tried;
  auto attempt = [&](const std::string& path) {
    if (lib.handle) return;
    // RTLD_GLOBAL: cuDNN's front library opens its sub-libraries, which resolve against it.
    lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (lib.handle) {
      lib.path = path;
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
