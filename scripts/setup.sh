#!/usr/bin/env bash
# Installs what accordion-engine needs on Debian/Ubuntu and builds it:
# system libraries with apt-get (when root), then npm ci (which builds the addon and the TypeScript).
# The test peers of `npm test` are installed too when root: PyTorch for the state_dict
# interoperability tests and Chromium for the HTML report (ACCORDION_TEST_PEERS=0 leaves them out).
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
fi
if ((${#missing[@]} + ${#peers[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${missing[*]} ${peers[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" "${peers[@]}" >/dev/null
  else
    if ((${#peers[@]})); then
      echo "setup: npm test needs the test peers ${peers[*]}; install them with:  sudo apt-get install -y ${peers[*]}" >&2
    fi
    if ((${#missing[@]})); then
      echo "setup: missing system packages: ${missing[*]}" >&2
      echo "setup: install them with:  sudo apt-get install -y ${missing[*]}" >&2
      exit 1
    fi
  fi
fi

npm ci --no-audit --no-fund
