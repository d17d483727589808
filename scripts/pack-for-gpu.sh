#!/usr/bin/env bash
# Packs what a GPU machine without Node, npm or a registry needs to run this checkout's kernel lab,
# GPU tests and GPU benchmarks into .node-dist/runtime.tar.xz (ignored by git; carry .node-dist
# with the checkout: at most 64 MiB). scripts/gpu-check/run.sh unpacks it there, again whenever the
# tarball's sha256 differs from the one its unpacked copy records. Build first: npm run build
# (with nvcc on the PATH, so that the addon has its CUDA half and build/Release/kernel_check exists).
#   bin/node       a stripped node
#   lib/           the shared libraries node, the addon and the kernel lab link (oneDNN, OpenBLAS,
#                  Gloo, libgfortran …), with the development links a rebuild looks for
#   cxx/           the C++ runtime of this machine's compiler (libstdc++, libgcc_s, libgomp), apart:
#                  run.sh uses each only where the GPU machine's own is missing or older, so a
#                  binary rebuilt there with its own compiler never loads an older copy from here
#   app/           build/Release (the addon, kernel_check), lib/ (the compiled TypeScript), the
#                  node_modules the tests, benchmarks and a rebuild use, and PACKED (what was packed)
#   include/       oneDNN, OpenBLAS and Gloo headers, to rebuild there if the carried build does not load
# and, beside the tarball, .node-dist/fashion-mnist: the training images the reproduction uses (the
# first 12,800) and the test set, for the GPU check's `reproduce` stage (/usr/share/datasets/fashion-mnist,
# Debian's dataset-fashion-mnist; skipped with a warning where it is not installed).
# With --prebuilt, .node-dist/prebuilt.tar.xz takes the data's place: the platform package of
# scripts/platform-package.js (the addon with its libraries beside it), for the `prebuilt` stage;
# the two do not fit one carried tree together.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  '') prebuilt=0 ;;
  --prebuilt) prebuilt=1 ;;
  *) echo "usage: bash scripts/pack-for-gpu.sh [--prebuilt]" >&2; exit 2 ;;
esac
addon=build/Release/accordion.node
[ -f "$addon" ] || { echo "pack-for-gpu: build the addon first (npm run build)" >&2; exit 1; }
[ -x build/Release/kernel_check ] || echo "pack-for-gpu: warning: no build/Release/kernel_check (the addon was built without nvcc)" >&2
out=.node-dist
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/cxx" "$stage/app/build" "$stage/include" "$out"
cp "$(command -v node)" "$stage/bin/node"
strip "$stage/bin/node" 2>/dev/null || true

# Every library the addon, the lab and node resolve, except the C runtime the target machine has
# itself; the compiler's C++ runtime goes to cxx/.
for file in "$addon" build/Release/kernel_check "$(command -v node)"; do
  [ -e "$file" ] && ldd "$file" | awk '/=> \//{print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' | while read -r lib; do
  case "$(basename "$lib")" in
    libstdc++.so.* | libgcc_s.so.* | libgomp.so.*) cp -L "$lib" "$stage/cxx/" ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
for soname in libdnnl.so.2 libopenblas.so.0 libgloo.so.0; do
  ln -sf "$soname" "$stage/lib/${soname%%.so*}.so"
done

cp -r build/Release "$stage/app/build/"
cp -r lib package.json "$stage/app/"
rm -f "$stage/app/lib/.runtime-sha256"
# The node_modules closure of what runs there: mocha and chai (tests), tinybench (benchmarks),
# node-gyp-build (loading the addon), node-addon-api and node-api-headers (a rebuild), chart.js and
# chartjs-chart-matrix (the runs' and the reproduction's reports).
node -e '
  const fs = require("fs"), path = require("path");
  const seen = new Set();
  const walk = (name) => {
    if (seen.has(name)) return;
    const manifest = path.join("node_modules", name, "package.json");
    if (!fs.existsSync(manifest)) return;
    seen.add(name);
    Object.keys(JSON.parse(fs.readFileSync(manifest, "utf8")).dependencies || {}).forEach(walk);
  };
  ["mocha", "chai", "tinybench", "node-gyp-build", "node-addon-api", "node-api-headers", "chart.js", "chartjs-chart-matrix"].forEach(walk);
  console.log([...seen].join("\n"));
' | while read -r module; do
  mkdir -p "$stage/app/node_modules/$(dirname "$module")"
  cp -r "node_modules/$module" "$stage/app/node_modules/$module"
done
mkdir -p "$stage/app/node_modules/.bin"
ln -sf ../mocha/bin/mocha.js "$stage/app/node_modules/.bin/mocha"
# What was packed, for the results: the commit (and whether the tree differed from it) and when.
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' with local changes')"
  echo "packed $(date -u +%FT%TZ) on $(uname -n)"
  echo "node $(node --version)"
} >"$stage/app/PACKED"

cp -rL /usr/include/oneapi /usr/include/dnnl*.h* /usr/include/gloo "$stage/include/"
blas=$(dirname "$(find /usr/include -name cblas.h -path '*openblas*' | head -1)")
cp -L "$blas"/*.h "$stage/include/"

# Fashion-MNIST as the reproduction reads it (its first N training images and the whole test set),
# or with --prebuilt the platform package's folder (what its npm tarball holds), in xz.
fashion=/usr/share/datasets/fashion-mnist
rm -rf "$out/fashion-mnist" "$out/prebuilt.tar.xz"
if ((prebuilt)); then
  node scripts/platform-package.js --addon "$addon" --out "$stage/platform"
  tar -C "$stage/platform" -cf - linux-x64-gnu | xz -9 -T1 >"$out/prebuilt.tar.xz"
  echo "pack-for-gpu: the platform package in $out/prebuilt.tar.xz ($(($(stat -c %s "$out/prebuilt.tar.xz") / 1048576)) MiB)"
elif [ -f "$fashion/train-images-idx3-ubyte.gz" ]; then
  node bench/reproduce.js data resnet18-powersgd --data "$fashion" --to "$out/fashion-mnist"
else
  echo "pack-for-gpu: warning: no $fashion (apt-get install dataset-fashion-mnist): the GPU check's reproduce stage will have no data" >&2
fi

tar -C "$stage" -cf - bin lib cxx app include | xz -9 -T1 >"$out/runtime.tar.xz.partial"
mv "$out/runtime.tar.xz.partial" "$out/runtime.tar.xz"
bytes=$(stat -c %s "$out/runtime.tar.xz")
echo "pack-for-gpu: $((bytes / 1048576)) MiB ($bytes bytes) in $out/runtime.tar.xz ($(ls "$stage/lib" | wc -l) libraries, $(ls "$stage/cxx" | wc -l) of the C++ runtime)"
echo "pack-for-gpu: sha256 $(sha256sum "$out/runtime.tar.xz" | cut -d' ' -f1)"
carried=$(du -sb "$out" | cut -f1)
if ((carried > 56 * 1048576)); then
  echo "pack-for-gpu: warning: $out holds $((carried / 1048576)) MiB: with the checkout (about 7 MiB) more than the 64 MiB a GPU machine's command carries" >&2
fi
