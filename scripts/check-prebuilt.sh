#!/usr/bin/env bash
# The prebuilt install as a user meets it: the two tarballs of scripts/platform-package.js installed
# into a fresh directory (install scripts allowed and run) with no compiler or cmake on the PATH and the system's
# copies of every bundled library hidden (a mount namespace binds an empty file over each); then
# `accordion info` and a short training run from there. Passes only if the addon came from the
# platform package and every library the process mapped, other than those Node itself links
# (glibc, libstdc++, libgcc), was loaded from the package. Needs root (unshare, mount).
#
#   bash scripts/check-prebuilt.sh [ADDON]      # default build/Release/accordion.node
set -euo pipefail
cd "$(dirname "$0")/.."
addon=${1:-build/Release/accordion.node}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"

node scripts/platform-package.js --addon "$addon" --out "$tmp/dist"
package_libs=$(ls "$tmp/dist/linux-x64-gnu/prebuilds/linux-x64" | grep '\.so')

# A PATH of Node, npm and the shell's basics: no compiler, no cmake.
mkdir "$tmp/bin" "$tmp/app"
for tool in node npm npx sh bash env cat ls mkdir rm cp mv grep sed uname; do
  ln -s "$(command -v "$tool")" "$tmp/bin/$tool"
done

cat > "$tmp/inside.sh" <<'INSIDE'
set -euo pipefail
tmp=$1; shift
# The system's copies of the bundled libraries, hidden behind an empty file each.
touch "$tmp/empty"
for soname in "$@"; do
  for file in $(ldconfig -p | awk -v n="$soname" '$1 == n { print $NF }'); do
    mount --bind "$tmp/empty" "$(readlink -f "$file")"
  done
done
cd "$tmp/app"
export PATH="$tmp/bin" HOME="$tmp/home" npm_config_cache="$NPM_CACHE"
mkdir -p "$HOME"
if command -v g++ cmake >/dev/null; then echo "check-prebuilt: a compiler is on the PATH" >&2; exit 1; fi
npm init -y >/dev/null
npm install --no-audit --no-fund --prefer-offline --dangerously-allow-all-scripts --foreground-scripts "$tmp"/dist/accordion-engine-linux-x64-gnu-*.tgz "$tmp"/dist/accordion-engine-[0-9]*.tgz
npx accordion info > info.json
OMP_NUM_THREADS=2 npx accordion train --model resnet18 --width 0.125 --epochs 1 --synthetic-train 256 --synthetic-test 64 \
  --batch-size 32 --quiet --out run
node -e '
  const fs = require("fs");
  const info = JSON.parse(fs.readFileSync("info.json", "utf8"));
  const pkg = fs.realpathSync("node_modules/@accordion-engine/linux-x64-gnu");
  const system = /^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so)/;
  const problems = [];
  if (info.loaded.addon.kind !== "platform package") problems.push(`the addon came from ${info.loaded.addon.file} (${info.loaded.addon.kind})`);
  for (const [name, file] of Object.entries(info.loaded.libraries))
    if (!system.test(name) && !fs.realpathSync(file).startsWith(pkg + "/")) problems.push(`${name} was loaded from ${file}`);
  const summary = JSON.parse(fs.readFileSync("run/summary.json", "utf8"));
  if (summary.epochs.length !== 1) problems.push("the training run did not finish its epoch");
  for (const p of problems) console.error(`check-prebuilt: ${p}`);
  if (problems.length) process.exit(1);
  console.log(`check-prebuilt: the addon and ${Object.keys(info.loaded.libraries).filter((n) => !system.test(n)).length} libraries loaded from ${pkg}; one epoch trained`);
'
INSIDE
NPM_CACHE=$(npm config get cache) unshare -m --propagation private bash "$tmp/inside.sh" "$tmp" $package_libs
