#!/usr/bin/env bash
# Installs what accordion-engine needs on Debian/Ubuntu and builds it:
# system libraries with apt-get (when root), then npm ci (which builds the addon and the TypeScript).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake g++ make libdnnl-dev ocl-icd-opencl-dev libopenblas-dev libgloo-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: missing system packages: ${missing[*]}" >&2
    echo "setup: install them with:  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

npm ci --no-audit --no-fund
