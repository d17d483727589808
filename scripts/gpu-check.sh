#!/usr/bin/env bash
# The GPU verification, cut into stages that each fit one command of at most 10 minutes on a GPU
# machine (35 s to start a cold one), all of them within 20 minutes so that a fix and a second run
# fit in 30. Stages can share one command while the machine stays warm (`bash scripts/gpu-check.sh
# suite; bash scripts/gpu-check.sh sanitizer`): each appends its own rows. First run on an H200 on
# 2026-11-26 (bench/results/gpu.md).
#
#   scripts/gpu-check.sh [plan]     the GPU-machine commands in order, with the minutes each is expected to take
#   scripts/gpu-check.sh STAGE      one stage, under `timeout` (its limit is in the plan):
#     probe        what the machine supports (GPU, driver, libraries, compute-sanitizer, the carried build)
#     abi-lab      cuda/lab/abi_check.cu against the real cuDNN, cuBLAS and NCCL headers, then the kernel
#                  lab, quick (5 timed launches), one `kernel_check --only FAMILY` process per op family
#     sanitizer    compute-sanitizer's memcheck, then racecheck, over `kernel_check --iterations 1` for
#                  every family, where the probe finds that compute-sanitizer accepts the device
#     suite        the GPU test suite (test/gpu/), the compression oracles and the native tests
#     bench-quick  bench/step.js, bench/lstm.js and bench/compression.js against PyTorch, a few steps
#     bench-full   the same with the benchmarks' full settings
#     rebuild      only when the probe says the carried build does not load here: builds it on the machine
#   scripts/gpu-check.sh summary FILE...   what gpu-check.jsonl files say, stage by stage (needs Node)
#   scripts/gpu-check.sh exec COMMAND...   COMMAND in the runtime's environment (node, the build, the
#                  libraries found as the stages find them), its output to the log: for a diagnosis
#
# Before: on a machine with Node and nvcc, npm run build && bash scripts/pack-for-gpu.sh, and carry
# .node-dist with the checkout. Each stage unpacks .node-dist/runtime.tar.xz into $ACCORDION_RUNTIME
# (/tmp/accordion-runtime) unless the unpacked copy records the tarball's sha256, and replaces
# build/ and lib/ with the runtime's unless they record it too (or a rebuild from it), so a stale
# runtime or build never runs. When the carried build does not load there, it is rebuilt with the
# machine's compiler into build-gpu/ and copied into build/Release. The packed C++ runtime (cxx/ in
# the tarball) is used only where the machine's own libstdc++, libgcc_s or libgomp is missing or
# older, so rebuilt binaries never load an older copy ahead of the machine's own.
#
# Results: every stage appends to $OUT/gpu-check.jsonl (./gpu-check-out without $OUT) one JSON
# object per line, written as each row ends (a killed stage leaves every finished row), and its
# output to $OUT/gpu-check.log: two files, whatever the stage. Rows carry "stage"; each stage
# begins with {"event": "begin"} and ends with {"event": "end", "status", "exitCode", "seconds"}.
#
# Exit status: 0 passed; 1 failed; 2 bad usage; 3 no usable device (no driver, no GPU, or cuDNN or
# cuBLAS missing); 5 not run, as the machine does not support it (the sanitizer where
# compute-sanitizer refuses the device); 6 no runtime to run with; 124 the stage ran past its limit.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
self=$repo/scripts/gpu-check.sh

# ---- The plan ---------------------------------------------------------------------------------
# stage | expected minutes | limit in seconds (the stage's own timeout) | what it does
# Expected minutes as measured on an H200 (2026-11-26), rounded up: probe 11 s, abi-lab 96-109 s,
# sanitizer 48 s, suite 148 s, bench-quick 56-69 s, bench-full 129 s.
PLAN=(
  "probe|0.5|60|what the machine supports: GPU, driver, cuDNN, cuBLAS, NCCL, compute-sanitizer, the carried build"
  "abi-lab|2|300|abi_check.cu against the real headers, then the kernel lab quick, one process per op family"
  "sanitizer|1|300|memcheck, then racecheck (the engine's kernels), over kernel_check --iterations 1 for every family"
  "suite|2.5|360|test/gpu/gpu-devices.test.js, test/gpu/gpu-training.test.js, test/native/gradients.test.js, test/compress/powersgd.test.js, test/compress/topk-error-feedback.test.js, test/compress/levels-and-floats.test.js, test/compress/reducer-state.test.js, test/native/binding.test.js with ACCORDION_REQUIRE_GPU=1"
  "bench-quick|1|240|bench/step.js, bench/lstm.js, bench/compression.js against PyTorch, a few steps"
  "bench-full|2.5|420|the same benchmarks with their full settings"
)
# Starting a cold machine, counted for every command: 35 s measured from the call to the command's
# start, the checkout's transfer (41 MB with .node-dist) included.
START_MINUTES=1
REBUILD_LIMIT=540

plan_field() {  # plan_field STAGE N: field N (1-based) of STAGE's plan line
  local line
  for line in "${PLAN[@]}"; do
    [ "${line%%|*}" = "$1" ] && { echo "$line" | cut -d'|' -f"$2"; return 0; }
  done
  return 1
}

print_plan() {
  echo "GPU check: ${#PLAN[@]} commands on the GPU machine, in this order, from the checkout's root with .node-dist carried."
  echo "Each stage runs under its own timeout; give the command a limit a minute longer (the unpacking of a cold machine)."
  echo
  printf '  %-2s %-40s %9s %8s  %s\n' "#" "command" "expected" "timeout" "what"
  local i=0 line stage minutes limit what
  for line in "${PLAN[@]}"; do
    IFS='|' read -r stage minutes limit what <<<"$line"
    i=$((i + 1))
    printf '  %-2s %-40s %5s min %6s s  %s\n' "$i" "bash scripts/gpu-check.sh $stage" "$minutes" "$limit" "$what"
  done
  echo
  printf '%s\n' "${PLAN[@]}" | awk -F'|' -v start="$START_MINUTES" '
    { work += $2; n++ }
    END {
      total = work + n * start
      printf "Expected GPU machine time: %.1f min of stages + %d commands x %d min of machine start = %.1f min", work, n, start, total
      printf " (at most 20, so that a fix and a second run fit in a 30-minute slot)\n"
    }'
  echo "Results of each command: \$OUT/gpu-check.jsonl (one JSON object per line, appended and flushed per row) and"
  echo "\$OUT/gpu-check.log: 2 files per command (at most 6 allowed). Read them with: bash scripts/gpu-check.sh summary FILE..."
  echo "If the probe reports that the carried build does not load: bash scripts/gpu-check.sh rebuild (timeout $REBUILD_LIMIT s)"
  echo "first; every stage also rebuilds by itself then, within its own timeout."
}

usage() {
  echo "usage: scripts/gpu-check.sh plan | probe | abi-lab | sanitizer | suite | bench-quick | bench-full | rebuild | summary FILE... | exec COMMAND..." >&2
}

# ---- Output ---------------------------------------------------------------------------------------
out=${OUT:-$repo/gpu-check-out}
results=$out/gpu-check.jsonl
log=$out/gpu-check.log
stage=${stage:-}

json() {  # a JSON string of $1
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/\\r}
  s=${s//$'\t'/\\t}
  printf '"%s"' "$(printf '%s' "$s" | tr -d '\000-\010\013\014\016-\037')"
}
now() { date -u +%FT%TZ; }
row() { printf '{"stage": %s, "time": %s, %s}\n' "$(json "$stage")" "$(json "$(now)")" "$1" >>"$results"; }
say() { echo "$*" | tee -a "$log"; }
# logged CAP COMMAND...: runs it, its output to the terminal and the log, at most CAP lines of it.
logged() {
  local cap=$1
  shift
  "$@" 2>&1 | awk -v cap="$cap" '
    NR <= cap { print; fflush() }
    NR == cap + 1 { print "[gpu-check: the rest of this output is left out of the log after " cap " lines]"; fflush() }' | tee -a "$log"
  return "${PIPESTATUS[0]}"
}
# Seconds left before the stage's own deadline.
left() { echo $((deadline - SECONDS)); }

# ---- The runtime: Node, libraries, the build, node_modules ------------------------------------------
runtime=${ACCORDION_RUNTIME:-/tmp/accordion-runtime}
tarball=$repo/.node-dist/runtime.tar.xz
runtime_sha=""
build_origin=""

# The newest version tag (GLIBCXX_3.4.32, GCC_14.0.0, GOMP_5.1) in a library file.
newest_tag() { grep -aoE "$2[0-9]+(\.[0-9]+)*" "$1" 2>/dev/null | sort -uV | tail -1; }
# The file the loader would take for SONAME without LD_LIBRARY_PATH.
machine_library() { { /sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null; } | awk -v n="$1" '$1 == n && /x86-64/ { print $NF; exit }'; }

# Links into $runtime/cxx-used each packed C++ runtime library whose version the machine's own
# lacks (missing, or an older newest version tag); the machine's own is used otherwise.
choose_cxx() {
  rm -rf "$runtime/cxx-used"
  mkdir -p "$runtime/cxx-used"
  local entry name prefix packed own mine theirs chosen=""
  for entry in libstdc++.so.6:GLIBCXX_ libgcc_s.so.1:GCC_ libgomp.so.1:GOMP_; do
    name=${entry%%:*} prefix=${entry#*:} packed=$runtime/cxx/$name
    [ -f "$packed" ] || continue
    own=$(machine_library "$name")
    theirs=$(newest_tag "$packed" "$prefix")
    mine=$([ -n "$own" ] && newest_tag "$own" "$prefix")
    if [ -z "$own" ] || [ "$(printf '%s\n%s\n' "$mine" "$theirs" | sort -V | tail -1)" != "$mine" ]; then
      ln -s "$packed" "$runtime/cxx-used/$name"
      chosen+="$name packed ($theirs; the machine's: ${mine:-none}), "
    else
      chosen+="$name the machine's ($own, $mine), "
    fi
  done
  cxx_choice=${chosen%, }
}

prepare_runtime() {
  if [ ! -f "$tarball" ]; then
    say "gpu-check: no .node-dist/runtime.tar.xz: run npm run build && bash scripts/pack-for-gpu.sh on a machine with Node and nvcc, and carry .node-dist"
    row '"event": "no runtime", "error": "no .node-dist/runtime.tar.xz"'
    return 1
  fi
  runtime_sha=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [ "$(cat "$runtime/.tarball-sha256" 2>/dev/null)" != "$runtime_sha" ]; then
    rm -rf "$runtime"
    mkdir -p "$runtime"
    if ! tar -xJf "$tarball" -C "$runtime"; then
      say "gpu-check: unpacking $tarball failed"
      row '"event": "no runtime", "error": "unpacking the tarball failed"'
      return 1
    fi
    echo "$runtime_sha" >"$runtime/.tarball-sha256"
    say "gpu-check: unpacked the runtime $runtime_sha into $runtime"
  fi
  # The build and the compiled TypeScript of this tarball, unless a rebuild from it replaced the build.
  local marker
  marker=$(cat build/.runtime-sha256 2>/dev/null)
  if [ "$marker" != "$runtime_sha" ] && [ "$marker" != "$runtime_sha rebuilt" ]; then
    if [ -d build ] && [ ! -f build/.runtime-sha256 ]; then  # a build made in this checkout: set aside, not lost
      rm -rf build-replaced
      mv build build-replaced
      say "gpu-check: this checkout's own build/ moved to build-replaced/"
    fi
    rm -rf build
    mkdir -p build
    cp -r "$runtime/app/build/Release" build/
    echo "$runtime_sha" >build/.runtime-sha256
    say "gpu-check: build/Release copied from the runtime"
  fi
  if [ "$(cat lib/.runtime-sha256 2>/dev/null)" != "$runtime_sha" ]; then
    mkdir -p lib
    find lib -mindepth 1 -maxdepth 1 ! -name .gitkeep -exec rm -rf {} +
    cp -r "$runtime/app/lib/." lib/
    echo "$runtime_sha" >lib/.runtime-sha256
    say "gpu-check: lib/ copied from the runtime"
  fi
  # A checkout there has no node_modules: the runtime's, linked (a real directory is left alone).
  if [ -L node_modules ] || [ ! -e node_modules ]; then ln -sfn "$runtime/app/node_modules" node_modules; fi
  build_origin=$([ "$(cat build/.runtime-sha256)" = "$runtime_sha rebuilt" ] && echo "rebuilt here" || echo "carried")
  choose_cxx
  rt_ld=$runtime/cxx-used:$runtime/lib
  export PATH=$runtime/bin:$PATH
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
  return 0
}

# The runtime's environment for what it runs (node, kernel_check); the machine's tools (nvcc, cmake,
# python, nvidia-smi) keep the machine's own.
rt() { LD_LIBRARY_PATH=$rt_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ACCORDION_SYSTEM_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} "$@"; }
kernel_check=$repo/build/Release/kernel_check

# Whether the build in build/Release loads and runs here: the addon in node, and kernel_check.
build_loads() {
  rt node -e "require('node-gyp-build')('.')" >/dev/null 2>&1 && [ -x "$kernel_check" ] && rt "$kernel_check" --self-check >/dev/null 2>&1
}

rebuild() {
  say "== rebuilding with the machine's compiler ($(command -v nvcc || echo 'no nvcc'), $(cmake --version 2>/dev/null | head -1))"
  row '"event": "rebuild", "reason": "the carried build does not load here"'
  local jobs
  jobs=$(nproc)
  logged 400 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DACCORDION_CUDA=ON -DCMAKE_PREFIX_PATH="$runtime" \
    -DCMAKE_INCLUDE_PATH="$runtime/include" -DCMAKE_LIBRARY_PATH="$runtime/lib" \
    -DCMAKE_JS_INC="$repo/node_modules/node-api-headers/include;$repo/node_modules/node-addon-api" \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$repo/build-gpu/Release" &&
    logged 400 cmake --build build-gpu -j "$jobs" || {
    say "gpu-check: the rebuild failed"
    row '"event": "rebuild failed"'
    return 1
  }
  # kernel_check lands in build-gpu/Release (the target's own output directory), the addon where
  # asked: both go where the stages look for them.
  mkdir -p build/Release
  cp build-gpu/Release/accordion.node build-gpu/Release/kernel_check build/Release/
  echo "$runtime_sha rebuilt" >build/.runtime-sha256
  build_origin="rebuilt here"
  device_json=""  # to be asked again, of the rebuilt kernel_check
  choose_cxx
  say "gpu-check: rebuilt into build/Release; C++ runtime: $cxx_choice"
  row "\"event\": \"rebuilt\", \"cxx\": $(json "$cxx_choice")"
}

# The build, rebuilt when it does not load (and $1 is not "no-rebuild").
prepare_build() {
  build_loads && return 0
  [ "${1:-}" = "no-rebuild" ] && return 1
  rebuild && build_loads
}

# cuda:0 as kernel_check sees it after one kernel ran there; sets device_json, or no_device.
device_json=""
no_device=""
check_device() {
  local output status
  if [ -x "$kernel_check" ] && rt "$kernel_check" --self-check >/dev/null 2>&1; then
    output=$(rt "$kernel_check" --device-info 2>&1)
    status=$?
    if [ $status -eq 0 ]; then
      device_json=$output
      return 0
    fi
    no_device=$(echo "$output" | sed -n 's/^kernel_check: cuda:0 is not usable: //p' | head -1)
    no_device=${no_device:-$output}
    return 1
  fi
  # kernel_check cannot start (the carried build does not load): what the driver says.
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    no_device=""
    return 0
  fi
  no_device="no NVIDIA driver found: nvidia-smi $(command -v nvidia-smi >/dev/null && echo 'lists no GPU' || echo 'is not installed'), and kernel_check cannot start here"
  return 1
}

# The stage's opening: runtime, device, build. Exits 3 without a runtime or a usable device.
open_stage() {
  prepare_runtime || exit 6
  if ! check_device; then
    say "gpu-check: $stage: no device: $no_device"
    row "\"event\": \"no device\", \"error\": $(json "$no_device")"
    exit 3
  fi
  if ! prepare_build "${1:-}"; then
    say "gpu-check: $stage: the build does not load here$([ "${1:-}" = "no-rebuild" ] && echo '; run bash scripts/gpu-check.sh rebuild')"
    row '"event": "build does not load"'
    exit 1
  fi
  [ -n "$device_json" ] || check_device || {  # after a rebuild
    say "gpu-check: $stage: no device: $no_device"
    row "\"event\": \"no device\", \"error\": $(json "$no_device")"
    exit 3
  }
  say "gpu-check: $stage on $(echo "$device_json" | sed -n 's/.*"device": "\([^"]*\)".*/\1/p'); build $build_origin; runtime ${runtime_sha:0:12}"
}

# Where pip put NVIDIA's packages (nvidia-cudnn-cu13 …): the nvidia/ directories of python3's path.
nvidia_dirs() {
  python3 -c 'import importlib.util as u; s = u.find_spec("nvidia"); print("\n".join(s.submodule_search_locations))' 2>/dev/null
}
find_in_nvidia() {  # find_in_nvidia NAME: the first file of that name in pip's nvidia packages
  local dirs
  dirs=$(nvidia_dirs)
  [ -n "$dirs" ] && find $dirs -maxdepth 4 -name "$1" 2>/dev/null | sort | head -1
}

# The libraries as the engine finds them by itself (site-packages/nvidia/…, without environment
# variables); where it misses one, the one pip has is named through ACCORDION_CUDNN and the like,
# and the row says so.
libraries() {
  local info
  info=$(rt node lib/cli.js info 2>/dev/null)
  libraries_json=$(echo "$info" | rt node -e '
    const j = JSON.parse(require("fs").readFileSync(0, "utf8"));
    const d = j.devices, out = {};
    for (const k of ["cudnn", "cublas", "nccl"]) out[k] = d[k].loaded ? { found: true, path: d[k].path, version: d[k].version } : { found: false, error: d[k].error.split("\n")[0] };
    console.log(JSON.stringify(out));' 2>/dev/null)
  libraries_json=${libraries_json:-null}
  local name lib var file set=""
  for name in "cudnn:ACCORDION_CUDNN:libcudnn.so.9" "cublas:ACCORDION_CUBLAS:libcublas.so.1[0-9]" "nccl:ACCORDION_NCCL:libnccl.so.2"; do
    IFS=: read -r lib var file <<<"$name"
    if echo "$libraries_json" | grep -q "\"$lib\":{\"found\":false"; then
      file=$(find_in_nvidia "$file")
      [ -n "$file" ] && export "$var=$file" && set+="$var=$file "
    fi
  done
  libraries_set=${set% }
}

# ---- Stages ----------------------------------------------------------------------------------------

# The op families the lab knows, from its --help.
families() { rt "$kernel_check" --help 2>/dev/null | sed -n '/--only NAMES/{n;p}' | tr -d ' ' | tr ',' ' '; }

stage_probe() {
  prepare_runtime || exit 6
  local smi sanitizer_path="" sanitizer_version="" sanitizer_accepts=false sanitizer_why="" builds=true torch
  if command -v nvidia-smi >/dev/null; then
    smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1) || smi="failed: $smi"
  else
    smi="not installed"
  fi
  say "nvidia-smi: $smi"
  prepare_build no-rebuild || builds=false
  say "build: $build_origin, $($builds && echo loads || echo 'does NOT load here: run bash scripts/gpu-check.sh rebuild next'); C++ runtime: $cxx_choice"
  check_device
  local device_ok=$?
  say "device: ${device_json:-$no_device}"
  libraries
  say "libraries found by the engine: $libraries_json${libraries_set:+; set by gpu-check: $libraries_set}"
  sanitizer_path=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$sanitizer_path" ]; then
    sanitizer_version=$("$sanitizer_path" --version 2>&1 | grep -iE 'version' | head -1)
    if [ $device_ok -eq 0 ]; then
      local output
      output=$(rt timeout 25 "$sanitizer_path" --tool memcheck --error-exitcode 99 "$kernel_check" --device-info 2>&1)
      local status=$?
      if [ $status -eq 0 ]; then
        sanitizer_accepts=true
      else
        sanitizer_why=$(echo "$output" | grep -m1 -iE 'not supported|error|unable' || echo "exit status $status")
      fi
    else
      sanitizer_why="no usable device"
    fi
  else
    sanitizer_why="compute-sanitizer is not installed"
  fi
  say "compute-sanitizer: ${sanitizer_path:-none} ${sanitizer_version}; accepts the device: $sanitizer_accepts${sanitizer_why:+ ($sanitizer_why)}"
  torch=$(timeout 20 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available" if torch.cuda.is_available() else "unavailable")' 2>&1 | tail -1)
  say "python3: $(python3 --version 2>&1); torch: $torch"
  row "\"event\": \"probe\", \"nvidiaSmi\": $(json "$smi"), \"device\": ${device_json:-null}, \"noDevice\": $(json "$no_device"), \
\"build\": $(json "$build_origin"), \"buildLoads\": $builds, \"packed\": $(json "$(cat "$runtime/app/PACKED" 2>/dev/null)"), \
\"runtimeSha256\": $(json "$runtime_sha"), \"cxx\": $(json "$cxx_choice"), \"libraries\": $libraries_json, \
\"librariesSetByGpuCheck\": $(json "$libraries_set"), \"sanitizer\": {\"path\": $(json "$sanitizer_path"), \
\"version\": $(json "$sanitizer_version"), \"acceptsDevice\": $sanitizer_accepts, \"why\": $(json "$sanitizer_why")}, \
\"nvcc\": $(json "$(nvcc --version 2>/dev/null | tail -1)"), \"cmake\": $(json "$(cmake --version 2>/dev/null | head -1)"), \
\"gxx\": $(json "$(g++ --version 2>/dev/null | head -1)"), \"torch\": $(json "$torch"), \"cpus\": $(nproc)"
  if [ $device_ok -ne 0 ]; then
    say "gpu-check: probe: no device: $no_device"
    exit 3
  fi
  $builds || exit 1
}

stage_abi_lab() {
  open_stage
  libraries
  # abi: our declarations of cuDNN, cuBLAS and NCCL against the real headers. pip's include
  # directories come after nvcc's own (-idirafter): nvidia/cu13/include also holds the CUDA runtime's
  # headers, which must not shadow those of the nvcc that compiles.
  say "== abi"
  local cudnn_h cublas_h nccl_h abi_status=1
  cudnn_h=$(find_in_nvidia cudnn.h)
  cublas_h=$(find_in_nvidia cublas_v2.h)
  nccl_h=$(find_in_nvidia nccl.h)
  if [ -z "$cudnn_h" ] || [ -z "$cublas_h" ] || [ -z "$nccl_h" ]; then
    say "abi: no cudnn.h, cublas_v2.h or nccl.h in pip's nvidia packages ($(nvidia_dirs | paste -sd' ' || echo none))"
    row '"event": "abi", "pass": false, "error": "headers not found"'
  else
    local flags=() dir
    for dir in "$(dirname "$cudnn_h")" "$(dirname "$cublas_h")" "$(dirname "$nccl_h")"; do flags+=(-Xcompiler -idirafter -Xcompiler "$dir"); done
    local output
    output=$(timeout 120 nvcc -std=c++17 -Icpp -Icuda "${flags[@]}" cuda/lab/abi_check.cu -o /tmp/accordion-abi-check 2>&1 && /tmp/accordion-abi-check 2>&1)
    abi_status=$?
    echo "$output" | head -60 | tee -a "$log"
    row "\"event\": \"abi\", \"pass\": $([ $abi_status -eq 0 ] && echo true || echo false), \"output\": $(json "$(echo "$output" | head -40)"), \
\"headers\": [$(json "$cudnn_h"), $(json "$cublas_h"), $(json "$nccl_h")]"
  fi

  # lab: one process per op family, so that a fault in one leaves the others measured.
  say "== lab (quick: 5 timed launches per op; one process per family)"
  local family status summary="" verdicts="" failed=0 per
  for family in $(families); do
    per=$(($(left) < 60 ? $(left) : 60))
    if ((per < 5)); then
      row "\"event\": \"family\", \"family\": $(json "$family"), \"status\": \"not run\", \"error\": \"the stage's time ran out\""
      summary+="$family not run; "
      verdicts+="$(json "$family"): \"not run\", "
      failed=1
      continue
    fi
    logged 600 rt timeout -k 5 "$per" "$kernel_check" --only "$family" --iterations 5 --jsonl "$results" --stage "$stage"
    status=$?
    family_row "$family" "$status" "$per"
    summary+="$family $family_status; "
    verdicts+="$(json "$family"): $(json "$family_status"), "
    [ "$family_status" = passed ] || failed=1
  done
  say "lab: ${summary%; }"
  row "\"event\": \"lab summary\", \"families\": {${verdicts%, }}"
  [ $abi_status -eq 0 ] && [ $failed -eq 0 ]
}

# family_row FAMILY STATUS LIMIT: the verdict of one kernel_check process, as a row; sets family_status.
family_row() {
  local why=""
  case $2 in
    0) family_status=passed ;;
    1) family_status=failed ;;
    3) family_status=crashed why="no usable device" ;;
    4) family_status=crashed
       why=$(grep -a "kernel_check: the CUDA context was lost: " "$log" | tail -1 | sed 's/.*was lost: //') ;;
    124 | 137) family_status=crashed why="timed out after $3 s" ;;
    *) family_status=crashed
       why="exit status $2$( (($2 > 128)) && echo " (signal $(kill -l $(($2 - 128)) 2>/dev/null))")" ;;
  esac
  row "\"event\": \"family\", \"family\": $(json "$1"), \"status\": \"$family_status\", \"exitCode\": $2${why:+, \"error\": $(json "$why")}"
  [ -n "$why" ] && family_status="$family_status ($why)"
}

stage_sanitizer() {
  open_stage
  libraries
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$sanitizer" ]; then
    say "gpu-check: sanitizer: compute-sanitizer is not installed: not run"
    row '"event": "sanitizer", "status": "not run", "error": "compute-sanitizer is not installed"'
    return 5
  fi
  local output status
  output=$(rt timeout 30 "$sanitizer" --tool memcheck --error-exitcode 99 "$kernel_check" --device-info 2>&1)
  status=$?
  if [ $status -ne 0 ]; then
    local why
    why=$(echo "$output" | grep -m1 -iE 'not supported|error|unable' || echo "exit status $status")
    say "gpu-check: sanitizer: compute-sanitizer does not accept this device: $why; not run"
    row "\"event\": \"sanitizer\", \"status\": \"not run\", \"error\": $(json "compute-sanitizer does not accept the device: $why")"
    return 5
  fi
  say "== sanitizer: $("$sanitizer" --version 2>&1 | grep -i version | head -1); 4 families at a time"
  # Memcheck first, then racecheck, each over every family, 4 processes at a time (the sanitizer's
  # work is on the CPU). Tensors above a cap are skipped (kernel_check --max-elements), so that the
  # odd sizes and the model shapes fit the time; the big bandwidth cases are the lab's.
  local tool cap share failed=0
  for tool in memcheck racecheck; do
    if [ $tool = memcheck ]; then cap=$((1 << 22)) share=$(($(left) * 55 / 100)); else cap=$((1 << 20)) share=$(($(left) - 10)); fi
    say "-- $tool (tensors up to $cap elements, $share s)"
    export -f sanitize_family json now row
    export sanitizer tool cap results log stage kernel_check rt_ld tool_end=$(($(date +%s) + share))
    families | tr ' ' '\n' | grep . | xargs -P 4 -I{} bash -c 'sanitize_family "$@"' _ {} || failed=1
  done
  [ $failed -eq 0 ]
}

# sanitize_family FAMILY: one family under $tool until $tool_end (seconds since the epoch), its
# findings as a row (run by xargs, in a shell of its own).
sanitize_family() {
  local family=$1 budget=$((tool_end - $(date +%s))) started=$SECONDS
  if ((budget < 10)); then
    row "\"event\": \"sanitizer\", \"tool\": \"$tool\", \"family\": $(json "$family"), \"status\": \"not run\", \"error\": \"the stage's time ran out\""
    return 1
  fi
  # No cap of its own: racecheck over cuDNN's convolutions needs most of the tool's share.
  local per=$budget output status errors findings verdict why=""
  # Racecheck instruments the engine's own kernels only (all in namespace accordion): over cuDNN's
  # convolutions it ran past 4 minutes, and the libraries' kernels are not ours to fix.
  local only_ours=()
  [ "$tool" = racecheck ] && only_ours=(--kernel-name kns=accordion)
  output=$(LD_LIBRARY_PATH=$rt_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout -k 5 "$per" "$sanitizer" --tool "$tool" --error-exitcode 99 \
    "${only_ours[@]}" --print-limit 20 "$kernel_check" --only "$family" --iterations 1 --max-elements "$cap" 2>&1)
  status=$?
  errors=$(echo "$output" | sed -nE 's/.*(ERROR|RACECHECK) SUMMARY: ([0-9]+) (error|hazard).*/\2/p' | tail -1)
  findings=$(echo "$output" | grep -aE '^========= ' | grep -avE 'COMPUTE-SANITIZER|SUMMARY' | head -40)
  case $status in
    0) verdict=clean ;;
    99) verdict=findings ;;
    124 | 137) verdict="timed out" why="after $per s" ;;
    1) verdict="check failed" ;;
    4) verdict=crashed why=$(echo "$output" | sed -n 's/.*the CUDA context was lost: //p' | tail -1) ;;
    *) verdict=crashed why="exit status $status$( ((status > 128)) && echo " (signal $(kill -l $((status - 128)) 2>/dev/null))")" ;;
  esac
  {
    echo "-- $tool $family: $verdict${why:+ ($why)}${errors:+, $errors reported} ($((SECONDS - started)) s)"
    [ -n "$findings" ] && echo "$findings"
  } | tee -a "$log"
  row "\"event\": \"sanitizer\", \"tool\": \"$tool\", \"family\": $(json "$family"), \"status\": $(json "$verdict"), \"exitCode\": $status, \
\"errors\": ${errors:-null}, \"seconds\": $((SECONDS - started)), \"findings\": $(json "$findings")${why:+, \"error\": $(json "$why")}"
  [ $status -eq 0 ]
}

stage_suite() {
  open_stage
  libraries
  say "== suite: test/gpu/gpu-devices.test.js test/gpu/gpu-training.test.js test/native/gradients.test.js test/compress/powersgd.test.js test/compress/topk-error-feedback.test.js test/compress/levels-and-floats.test.js test/compress/reducer-state.test.js test/native/binding.test.js (ACCORDION_REQUIRE_GPU=1)"
  export ACCORDION_TEST_PYTHON=${ACCORDION_TEST_PYTHON:-$(command -v python3)}  # the machine's PyTorch: the float64 oracle
  # mocha's json-stream reporter gives a line per test as it ends: each becomes a row at once.
  ACCORDION_REQUIRE_GPU=1 rt node node_modules/mocha/bin/mocha.js --no-config --timeout 600000 --reporter json-stream \
    test/gpu/gpu-devices.test.js test/gpu/gpu-training.test.js test/native/gradients.test.js \
    test/compress/powersgd.test.js test/compress/topk-error-feedback.test.js test/compress/levels-and-floats.test.js test/compress/reducer-state.test.js test/native/binding.test.js 2>&1 |
    rt node -e '
      const fs = require("fs"), readline = require("readline");
      const [results, log] = process.argv.slice(1);
      const at = () => new Date().toISOString().replace(/\.\d+Z$/, "Z");
      const say = (text) => { process.stdout.write(text + "\n"); fs.appendFileSync(log, text + "\n"); };
      let failed = false;
      readline.createInterface({ input: process.stdin }).on("line", (line) => {
        let event;
        try { event = JSON.parse(line); } catch { say(line); return; }
        if (!Array.isArray(event)) { say(line); return; }
        const [kind, data] = event;
        if (kind === "pass" || kind === "fail") {
          const row = { stage: "suite", time: at(), event: "test", test: data.fullTitle, state: kind === "pass" ? "passed" : "failed", ms: data.duration ?? null };
          if (kind === "fail") { row.error = String(data.err ?? "").slice(0, 4000); failed = true; }
          fs.appendFileSync(results, JSON.stringify(row) + "\n");
          say(`${kind === "pass" ? "  ok    " : "  FAILED"} ${data.fullTitle}${kind === "fail" ? "\n      " + row.error.split("\n").slice(0, 6).join("\n      ") : ""}`);
        } else if (kind === "end") {
          fs.appendFileSync(results, JSON.stringify({ stage: "suite", time: at(), event: "tests", ...data }) + "\n");
          say(`suite: ${data.passes} passing, ${data.failures} failing, ${data.pending} pending (${data.duration} ms)`);
        }
      }).on("close", () => process.exit(failed ? 1 : 0));
    ' "$results" "$log"
  local status=("${PIPESTATUS[@]}")
  [ "${status[0]}" -eq 0 ] && [ "${status[1]}" -eq 0 ]
}

# bench_stage quick|full: the three benchmarks, each a row with its JSON, within the stage's time.
bench_stage() {
  open_stage
  libraries
  export ACCORDION_BENCH_PYTHON=${ACCORDION_BENCH_PYTHON:-$(command -v python3)}
  local rounds compression=() tmp failed=0
  if [ "$1" = quick ]; then rounds=(--warmup 2 --steps 5 --rounds 1) compression=(--quick); else rounds=(--warmup 5 --steps 20 --rounds 2); fi
  tmp=$(mktemp -d)
  local name per status verdict result
  # The time left is shared: half to the CNN steps, half of the rest to the LSTM, the rest to compression.
  for name in step lstm compression; do
    case $name in step | lstm) per=$(($(left) / 2)) ;; *) per=$(($(left) - 5)) ;; esac
    if ((per < 20)); then
      row "\"event\": \"bench\", \"bench\": \"$name\", \"status\": \"not run\", \"error\": \"the stage's time ran out\""
      failed=1
      continue
    fi
    say "== bench/$name.js ($1, $per s at most)"
    case $name in
      step) logged 400 rt timeout -k 5 "$per" node bench/step.js --device cuda --batch 128 --models resnet18,vgg19bn "${rounds[@]}" --json "$tmp/$name.json" ;;
      lstm) logged 400 rt timeout -k 5 "$per" node bench/lstm.js --device cuda "${rounds[@]}" --json "$tmp/$name.json" ;;
      compression) logged 400 rt timeout -k 5 "$per" node bench/compression.js --device cuda "${compression[@]}" --json "$tmp/$name.json" ;;
    esac
    status=$?
    case $status in 0) verdict=passed ;; 124 | 137) verdict="timed out" ;; *) verdict=failed ;; esac
    [ $status -eq 0 ] || failed=1
    result=$(rt node -e 'const fs = require("fs"); process.stdout.write(JSON.stringify(JSON.parse(fs.readFileSync(process.argv[1], "utf8"))))' \
      "$tmp/$name.json" 2>/dev/null) || result=null
    row "\"event\": \"bench\", \"bench\": \"$name\", \"status\": \"$verdict\", \"exitCode\": $status, \"result\": $result"
  done
  rm -rf "$tmp"
  [ $failed -eq 0 ]
}

stage_rebuild() {
  prepare_runtime || exit 6
  rebuild || exit 1
  build_loads || { say "gpu-check: the rebuilt build does not load either"; exit 1; }
}

# ---- Summary (on any machine with Node) -------------------------------------------------------------
summary() {
  node -e '
    const fs = require("fs");
    const rows = process.argv.slice(1).flatMap((f) => fs.readFileSync(f, "utf8").split("\n").filter(Boolean).map((l) => {
      try { return JSON.parse(l); } catch { return { stage: "?", event: "unreadable", line: l }; }
    }));
    // Families that passed (or ran clean) are listed together; anything else on a line of its own.
    // (The lab writes an end row of its own per family: the family row says all it does.)
    const good = new Map();
    const flush = () => {
      for (const [what, names] of good) console.log(`  ${what} (${names.length}): ${names.join(", ")}`);
      good.clear();
    };
    const group = (what, name) => good.set(what, [...(good.get(what) ?? []), name]);
    for (const r of rows) {
      if (r.event === "end" && "exitCode" in r) { flush(); console.log(`${r.stage}: ${r.status} (exit ${r.exitCode}, ${r.seconds} s)`); }
      else if (r.event === "no device" || r.event === "no runtime") console.log(`  ${r.event}: ${r.error}`);
      else if (r.event === "probe") console.log(`  device ${r.device ? r.device.device : "none"}; build ${r.build}${r.buildLoads ? "" : " (does not load)"}; compute-sanitizer ${r.sanitizer.acceptsDevice ? "accepts the device" : "not usable: " + r.sanitizer.why}; torch ${r.torch}`);
      else if (r.event === "abi") console.log(`  abi: ${r.pass ? "passed" : "FAILED: " + (r.error ?? r.output)}`);
      else if (r.event === "family" && r.status === "passed") group("lab families passed", r.family);
      else if (r.event === "family") console.log(`  lab ${r.family}: ${r.status}${r.error ? " (" + r.error + ")" : ""}`);
      else if (r.event === "sanitizer" && r.status === "clean") group(`${r.tool} clean`, r.family);
      else if (r.event === "sanitizer") console.log(`  ${r.tool ?? "sanitizer"} ${r.family ?? ""}: ${r.status}${r.error ? " (" + r.error + ")" : ""}${r.errors ? ", " + r.errors + " reported: " + r.findings.split("\n")[0] : ""}`);
      else if (r.event === "tests") console.log(`  tests: ${r.passes} passing, ${r.failures} failing, ${r.pending} pending`);
      else if (r.event === "test" && r.state === "failed") console.log(`  FAILED ${r.test}: ${String(r.error).split("\n")[0]}`);
      else if (r.event === "bench") console.log(`  bench ${r.bench}: ${r.status}`);
      else if (r.op && r.pass === false) console.log(`  FAILED check ${r.family} ${r.op} ${r.shape ?? ""}: ${(r.failures || []).join("; ")}`);
      else if (r.event === "unreadable") console.log(`  (an unreadable line: ${r.line.slice(0, 80)})`);
    }
    flush();
  ' "$@"
}

# ---- Dispatch ----------------------------------------------------------------------------------------

# The stage under its timeout, between a begin and an end row.
run_stage() {
  stage=$1
  local limit
  limit=$(plan_field "$stage" 3 || echo "$REBUILD_LIMIT")
  mkdir -p "$out"
  row "\"event\": \"begin\", \"limit\": $limit, \"host\": $(json "$(uname -n)"), \"checkout\": $(json "$repo")"
  say "== gpu-check $stage $(now) (timeout $limit s; results in $results)"
  local started=$SECONDS status verdict
  stage=$stage timeout -k 15 "$limit" bash "$self" --inner "$stage"
  status=$?
  case $status in
    0) verdict=passed ;;
    3) verdict="no device" ;;
    5) verdict="not run: not supported on this machine" ;;
    6) verdict="no runtime" ;;
    124 | 137) verdict="timed out after $limit s" ;;
    *) verdict=failed ;;
  esac
  row "\"event\": \"end\", \"status\": $(json "$verdict"), \"exitCode\": $status, \"seconds\": $((SECONDS - started))"
  say "gpu-check: $stage $verdict (exit $status, $((SECONDS - started)) s)"
  exit "$status"
}

case "${1:-}" in
  "" | plan) print_plan ;;
  exec)
    shift
    (($#)) || { usage; exit 2; }
    stage=exec
    mkdir -p "$out"
    open_stage
    libraries
    export ACCORDION_TEST_PYTHON=${ACCORDION_TEST_PYTHON:-$(command -v python3)}
    say "== exec: $*"
    rt "$@" 2>&1 | tee -a "$log"
    exit "${PIPESTATUS[0]}"
    ;;
  probe | abi-lab | sanitizer | suite | bench-quick | bench-full | rebuild) run_stage "$1" ;;
  --inner)
    stage=$2
    deadline=$((SECONDS + $(plan_field "$stage" 3 || echo "$REBUILD_LIMIT") - 10))
    case $stage in
      probe) stage_probe ;;
      abi-lab) stage_abi_lab ;;
      sanitizer) stage_sanitizer ;;
      suite) stage_suite ;;
      bench-quick) bench_stage quick ;;
      bench-full) bench_stage full ;;
      rebuild) stage_rebuild ;;
    esac
    ;;
  summary)
    shift
    (($#)) || { usage; exit 2; }
    summary "$@"
    ;;
  *) usage; exit 2 ;;
esac
