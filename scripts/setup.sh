#!/usr/bin/env bash
# Installs what accordion-engine needs on Debian/Ubuntu and builds it: system libraries with
# apt-get, then npm ci (which builds the addon and the TypeScript). The test peers of `npm test` are
# installed with them: PyTorch for the state_dict interoperability tests, Chromium to open the HTML
# report, Open MPI's mpirun to start workers as an MPI job, Fashion-MNIST (real images for the
# reader's tests and bench/reproduce.js), patchelf (the prebuilt package's check,
# scripts/check-prebuilt.sh) and ccache, through which rebuilds reuse unchanged objects
# (ACCORDION_TEST_PEERS=0 leaves them out). As root it installs what is missing; as a user it prints
# the one `sudo apt-get install` command that does, and stops when a library the build needs is
# among it.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake g++ make libdnnl-dev ocl-icd-opencl-dev libopenblas-dev libgloo-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
peers=()
if [ "${ACCORDION_TEST_PEERS:-1}" != 0 ]; then
  /usr/bin/python3 -c "import torch" 2>/dev/null || peers+=(python3-torch)
  [ -x /usr/bin/chromium ] || peers+=(chromium)
  mpirun --version 2>/dev/null | grep -q 'Open MPI' || peers+=(openmpi-bin)
  [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || peers+=(dataset-fashion-mnist)
  command -v patchelf >/dev/null || peers+=(patchelf)
  command -v ccache >/dev/null || peers+=(ccache)  # the second, CPU-only build of .ci/run reuses the first's objects
fi
needed=("${missing[@]}" "${peers[@]}")
if ((${#needed[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${needed[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${needed[@]}" >/dev/null
  else
    echo "setup: run this once, then this script again:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${needed[*]}" >&2
    if ((${#missing[@]})); then
      echo "setup: the build needs ${missing[*]}" >&2
      exit 1
    fi
    echo "setup: npm test needs the test peers ${peers[*]}; building without them" >&2
  fi
fi

npm ci --no-audit --no-fund
