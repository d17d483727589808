#!/usr/bin/env bash
# Packs what a GPU machine without Node needs to run this project's built addon and lib/:
# a stripped node binary and the shared libraries the addon links (oneDNN, OpenBLAS, Gloo, OpenMP …)
# into .node-dist/ (ignored by git), xz-compressed. On the GPU machine:
#   mkdir -p /tmp/accordion && tar -xJf .node-dist/runtime.tar.xz -C /tmp/accordion
#   export PATH=/tmp/accordion/bin:$PATH LD_LIBRARY_PATH=/tmp/accordion/lib
#   node lib/cli.js info
set -euo pipefail
cd "$(dirname "$0")/.."
addon=build/Release/accordion.node
[ -f "$addon" ] || { echo "pack-for-gpu: build the addon first (npm run build)" >&2; exit 1; }
out=.node-dist
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$out"
cp "$(command -v node)" "$stage/bin/node"
strip "$stage/bin/node" 2>/dev/null || true
# Every library the addon and node resolve, except the C runtime the target machine has itself.
for file in "$addon" "$(command -v node)"; do
  ldd "$file" | awk '/=> \//{print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' | while read -r lib; do
  cp -L "$lib" "$stage/lib/"
done
tar -C "$stage" -cJf "$out/runtime.tar.xz" bin lib
echo "pack-for-gpu: $(du -h "$out/runtime.tar.xz" | cut -f1) in $out/runtime.tar.xz ($(ls "$stage/lib" | wc -l) libraries)"
