#!/usr/bin/env bash
# The GPU check on a machine without Node: unpacks the runtime that scripts/pack-for-gpu.sh packed
# (.node-dist/runtime.tar.xz, carried with the checkout) and hands over to its node, which runs the
# check (scripts/gpu-check/main.js).
#
#   bash scripts/gpu-check/run.sh plan | STAGE | summary FILE... | exec COMMAND...
#
# The tarball is unpacked into $ACCORDION_RUNTIME (/tmp/accordion-runtime) unless the unpacked copy
# records its sha256; build/ and lib/ are replaced with the runtime's unless they record it too (or
# a rebuild from it), so that a stale runtime or build never runs; a checkout's own build/ is moved
# to build-replaced/. The packed C++ runtime (cxx/) is used only where the machine's own libstdc++,
# libgcc_s or libgomp is missing or older, so that a binary rebuilt there never loads an older copy.
# Exit status 6 (and rows saying so) where there is no runtime to run with.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
runtime=${ACCORDION_RUNTIME:-/tmp/accordion-runtime}
tarball=$repo/.node-dist/runtime.tar.xz
out=${OUT:-$repo/gpu-check-out}

# No runtime: rows and a line in the log, without Node.
no_runtime() {
  local stage=$1 error=$2 t
  mkdir -p "$out"
  t=$(date -u +%FT%TZ)
  echo "gpu-check: $error" | tee -a "$out/gpu-check.log"
  {
    printf '{"stage": "%s", "time": "%s", "event": "begin"}\n' "$stage" "$t"
    printf '{"stage": "%s", "time": "%s", "event": "no runtime", "error": "%s"}\n' "$stage" "$t" "$error"
    printf '{"stage": "%s", "time": "%s", "event": "end", "status": "no runtime", "exitCode": 6, "seconds": 0}\n' "$stage" "$t"
  } >>"$out/gpu-check.jsonl"
  exit 6
}

if [ ! -f "$tarball" ]; then
  # plan and summary need only a node, where there is one.
  case "${1:-plan}" in plan | summary) command -v node >/dev/null && exec node "$repo/scripts/gpu-check/main.js" "$@" ;; esac
  no_runtime "${1:-plan}" "no .node-dist/runtime.tar.xz: run npm run build && bash scripts/pack-for-gpu.sh on a machine with Node and nvcc, and carry .node-dist"
fi
sha=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$(cat "$runtime/.tarball-sha256" 2>/dev/null)" != "$sha" ]; then
  rm -rf "$runtime" && mkdir -p "$runtime"
  tar -xJf "$tarball" -C "$runtime" || no_runtime "${1:-plan}" "unpacking $tarball failed"
  echo "$sha" >"$runtime/.tarball-sha256"
  echo "gpu-check: unpacked the runtime $sha into $runtime"
fi
marker=$(cat build/.runtime-sha256 2>/dev/null)
if [ "$marker" != "$sha" ] && [ "$marker" != "$sha rebuilt" ]; then
  if [ -d build ] && [ ! -f build/.runtime-sha256 ]; then
    rm -rf build-replaced && mv build build-replaced && echo "gpu-check: this checkout's own build/ moved to build-replaced/"
  fi
  rm -rf build && mkdir -p build && cp -r "$runtime/app/build/Release" build/ && echo "$sha" >build/.runtime-sha256
fi
if [ "$(cat lib/.runtime-sha256 2>/dev/null)" != "$sha" ]; then
  mkdir -p lib && find lib -mindepth 1 -maxdepth 1 ! -name .gitkeep -exec rm -rf {} +
  cp -r "$runtime/app/lib/." lib/ && echo "$sha" >lib/.runtime-sha256
fi
# A checkout there has no node_modules: the runtime's, linked (a real directory is left alone).
if [ -L node_modules ] || [ ! -e node_modules ]; then ln -sfn "$runtime/app/node_modules" node_modules; fi

# The newest version tag (GLIBCXX_3.4.32, GCC_14.0.0, GOMP_5.1) in a library file.
newest_tag() { grep -aoE "$2[0-9]+(\.[0-9]+)*" "$1" 2>/dev/null | sort -uV | tail -1; }
# The file the loader would take for SONAME without LD_LIBRARY_PATH.
machine_library() { { /sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null; } | awk -v n="$1" '$1 == n && /x86-64/ { print $NF; exit }'; }
rm -rf "$runtime/cxx-used" && mkdir -p "$runtime/cxx-used"
choice=""
for entry in libstdc++.so.6:GLIBCXX_ libgcc_s.so.1:GCC_ libgomp.so.1:GOMP_; do
  name=${entry%%:*} prefix=${entry#*:} packed=$runtime/cxx/${entry%%:*}
  [ -f "$packed" ] || continue
  own=$(machine_library "$name")
  theirs=$(newest_tag "$packed" "$prefix")
  mine=$([ -n "$own" ] && newest_tag "$own" "$prefix")
  if [ -z "$own" ] || [ "$(printf '%s\n%s\n' "$mine" "$theirs" | sort -V | tail -1)" != "$mine" ]; then
    ln -s "$packed" "$runtime/cxx-used/$name"
    choice+="$name packed ($theirs; the machine's: ${mine:-none}), "
  else
    choice+="$name the machine's ($own, $mine), "
  fi
done

# What the driver needs to know: the runtime, its libraries' path (for what runs from the runtime:
# node, kernel_check; the machine's tools keep their own), and the C++ runtime chosen.
export ACCORDION_RUNTIME=$runtime ACCORDION_RUNTIME_SHA=$sha ACCORDION_RUNTIME_LD=$runtime/cxx-used:$runtime/lib ACCORDION_CXX_CHOICE=${choice%, }
export PATH=$runtime/bin:$PATH OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
# The machine's own path is taken before the runtime's is put in front of it (assignments before a
# command expand in order, so one line would hand the machine's tools the runtime's path too).
export ACCORDION_SYSTEM_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
LD_LIBRARY_PATH=$ACCORDION_RUNTIME_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec node "$repo/scripts/gpu-check/main.js" "$@"
