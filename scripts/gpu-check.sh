#!/usr/bin/env bash
# The GPU verification in one command, on a machine with an NVIDIA GPU, nvcc and PyTorch but no Node
# (pack the runtime here first: npm run build && bash scripts/pack-for-gpu.sh, and carry .node-dist):
#   scripts/gpu-check.sh [abi] [lab] [suite] [bench] [--quick]      (no stage named: all four)
# It unpacks .node-dist/runtime.tar.xz (Node, the shared libraries, the built addon and lab, the
# compiled TypeScript and the test modules), rebuilds when the carried build does not load there,
# finds cuDNN and cuBLAS (pip's nvidia-* packages beside PyTorch), then runs the stages:
#   abi    cuda/lab/abi_check.cu compiled against the real cuDNN, cuBLAS and NCCL headers
#   lab    the kernel lab: every CUDA op against its CPU op, then timed against the copy bandwidth
#   suite  the GPU test suite (test/gpu.test.js), the compression oracles on the GPU and the native tests
#   bench  the training steps of the CNNs (bench/step.js) and of the LSTM (bench/lstm.js), and the
#          compression rounds (bench/compression.js), against PyTorch on the same GPU
# and writes gpu-check.log and gpu-check.json (with lab.json and the bench*.json) into $OUT, or
# ./gpu-check-out. Exit code 0 when every stage run passed.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

stages=()
quick=0
for arg in "$@"; do
  case "$arg" in
    abi | lab | suite | bench) stages+=("$arg") ;;
    --quick) quick=1 ;;
    *) echo "usage: scripts/gpu-check.sh [abi] [lab] [suite] [bench] [--quick]" >&2; exit 2 ;;
  esac
done
((${#stages[@]})) || stages=(abi lab suite bench)

out=${OUT:-$repo/gpu-check-out}
mkdir -p "$out"
log=$out/gpu-check.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }
run() { "$@" 2>&1 | tee -a "$log"; return "${PIPESTATUS[0]}"; }

# --- The runtime: Node, libraries, the build, node_modules -------------------------------------
runtime=${ACCORDION_RUNTIME:-/tmp/accordion-runtime}
if [ ! -x "$runtime/bin/node" ]; then
  [ -f .node-dist/runtime.tar.xz ] || { say "gpu-check: no .node-dist/runtime.tar.xz: run scripts/pack-for-gpu.sh and carry .node-dist"; exit 1; }
  mkdir -p "$runtime" && tar -xJf .node-dist/runtime.tar.xz -C "$runtime"
fi
# A checkout has lib/ (holding .gitkeep) but none of the build outputs.
[ -f build/Release/accordion.node ] || cp -r "$runtime/app/build" .
[ -f lib/index.js ] || cp -r "$runtime/app/lib/." lib/
[ -d node_modules/mocha ] || cp -r "$runtime/app/node_modules" .
# Where pip put NVIDIA's libraries (nvidia-cudnn-cu13, nvidia-cublas …), beside PyTorch.
nvidia=$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia"); print("\n".join(s.submodule_search_locations))' 2>/dev/null)
find_in_nvidia() { [ -n "$nvidia" ] && find $nvidia -maxdepth 4 -name "$1" 2>/dev/null | sort | head -1; }
nvidia_libs=$([ -n "$nvidia" ] && find $nvidia -maxdepth 4 -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
cudnn=$(find_in_nvidia 'libcudnn.so.*')
cublas=$(find_in_nvidia 'libcublas.so.*')
nccl=$(find_in_nvidia 'libnccl.so.*')
[ -n "$cudnn" ] && export ACCORDION_CUDNN=$cudnn
[ -n "$cublas" ] && export ACCORDION_CUBLAS=$cublas
[ -n "$nccl" ] && export ACCORDION_NCCL=$nccl
# The packed libraries are for Node and the addon; the PyTorch peer keeps the machine's own path.
export ACCORDION_SYSTEM_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH=$runtime/lib${nvidia_libs:+:$nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$runtime/bin:$PATH
export ACCORDION_BENCH_PYTHON=${ACCORDION_BENCH_PYTHON:-$(command -v python3)}

say "== gpu-check $(date -u +%FT%TZ): stages ${stages[*]}$( ((quick)) && echo ' (quick)')"
run nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
say "cuDNN: ${cudnn:-not found}; cuBLAS: ${cublas:-not found}; NCCL: ${nccl:-not found}"

# --- The build: the carried one, or one made here ----------------------------------------------
if ! node -e "require('node-gyp-build')('.')" >/dev/null 2>&1 || [ ! -x build/Release/kernel_check ]; then
  say "== the carried build does not load here; rebuilding"
  run cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DACCORDION_CUDA=ON -DCMAKE_PREFIX_PATH="$runtime" \
    -DCMAKE_JS_INC="$repo/node_modules/node-api-headers/include;$repo/node_modules/node-addon-api" \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$repo/build/Release" &&
    run cmake --build build-gpu -j "$(nproc)" || { say "gpu-check: the rebuild failed"; exit 1; }
fi
run node lib/cli.js info

declare -A status
# --- abi: our declared cuDNN/cuBLAS/NCCL prototypes against the real headers ------------------------
if [[ " ${stages[*]} " == *" abi "* ]]; then
  say "== abi"
  cudnn_h=$(find_in_nvidia cudnn.h)
  cublas_h=$(find_in_nvidia cublas_v2.h)
  nccl_h=$(find_in_nvidia nccl.h)
  if [ -z "$cudnn_h" ] || [ -z "$cublas_h" ] || [ -z "$nccl_h" ]; then
    say "abi: no cudnn.h, cublas_v2.h or nccl.h in the nvidia pip packages (${nvidia:-none found})"
    status[abi]=1
  else
    run nvcc -std=c++17 -Icpp -Icuda -I"$(dirname "$cudnn_h")" -I"$(dirname "$cublas_h")" -I"$(dirname "$nccl_h")" \
      cuda/lab/abi_check.cu -o /tmp/abi_check &&
      run /tmp/abi_check
    status[abi]=$?
  fi
fi

# --- lab: every CUDA op against its CPU op, then timed -------------------------------------------
if [[ " ${stages[*]} " == *" lab "* ]]; then
  say "== lab"
  run build/Release/kernel_check --json "$out/lab.json" $( ((quick)) && echo --iterations 5)
  status[lab]=$?
fi

# --- suite: the GPU tests ------------------------------------------------------------------------
if [[ " ${stages[*]} " == *" suite "* ]]; then
  say "== suite"
  ACCORDION_REQUIRE_GPU=1 run node node_modules/mocha/bin/mocha.js --no-config --timeout 600000 test/gpu.test.js test/compression.test.js \
    test/native.test.js
  status[suite]=$?
fi

# --- bench: the training steps and compression rounds against PyTorch on the same GPU ----------
if [[ " ${stages[*]} " == *" bench "* ]]; then
  say "== bench"
  if ((quick)); then rounds=(--warmup 2 --steps 5 --rounds 1); else rounds=(--warmup 5 --steps 30 --rounds 3); fi
  status[bench]=0
  run node bench/step.js --device cuda --batch 128 --models resnet18,vgg19bn "${rounds[@]}" --json "$out/bench.json" || status[bench]=1
  run node bench/lstm.js --device cuda "${rounds[@]}" --json "$out/bench-lstm.json" || status[bench]=1
  run node bench/compression.js --device cuda $( ((quick)) && echo --quick) --json "$out/bench-compression.json" || status[bench]=1
fi

# --- One JSON of everything ----------------------------------------------------------------------
summary=""
for stage in "${stages[@]}"; do summary+="\"$stage\":${status[$stage]:-1},"; done
node -e '
  const fs = require("fs");
  const [out, statuses] = process.argv.slice(1);
  const exits = JSON.parse(`{${statuses.replace(/,$/, "")}}`);
  const read = (f) => {
    try {
      return JSON.parse(fs.readFileSync(`${out}/${f}`, "utf8"));
    } catch {
      return undefined;  // the stage did not run, or stopped before writing its results
    }
  };
  const log = fs.readFileSync(`${out}/gpu-check.log`, "utf8");
  const count = (word) => Number((log.match(new RegExp(`(\\d+) ${word}`)) || [])[1] ?? 0);
  const result = {
    date: new Date().toISOString(),
    stages: Object.fromEntries(Object.entries(exits).map(([s, code]) => [s, { passed: code === 0, exitCode: code }])),
    lab: read("lab.json"),
    suite: exits.suite === undefined ? undefined : { passing: count("passing"), failing: count("failing"), pending: count("pending") },
    bench: read("bench.json"),
    benchLstm: read("bench-lstm.json"),
    benchCompression: read("bench-compression.json"),
  };
  result.passed = Object.values(result.stages).every((s) => s.passed);
  fs.writeFileSync(`${out}/gpu-check.json`, JSON.stringify(result, null, 2) + "\n");
  console.log(`gpu-check: ${Object.entries(result.stages).map(([s, r]) => `${s} ${r.passed ? "passed" : "FAILED"}`).join(", ")}`);
  process.exit(result.passed ? 0 : 1);
' "$out" "$summary" 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
