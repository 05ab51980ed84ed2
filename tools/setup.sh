# Shared by tools/quickstart and tools/check: install what is missing (Debian 12, as root), then
# configure and build. Idempotent: a second run installs nothing and rebuilds only what changed.
# Usage: tools/setup.sh [BUILD_DIR [MESON_OPTION...]]   (default: build/)
set -euo pipefail
cd "$(dirname "$0")/.."
builddir=${1:-build}
shift || true

packages=(meson ninja-build g++ pkg-config python3 libhwloc-dev libibverbs-dev googletest libgtest-dev libbenchmark-dev
          clang libclang-rt-14-dev  # clang: the libFuzzer targets (tools/fuzz)
          python3-torch libtorch-dev pybind11-dev  # the PyTorch backend (python/braid_torch)
          python3-mesonpy python3-venv python3-pip patchelf  # pip install . (pyproject.toml; the install suite)
          ibverbs-utils perftest  # real verbs programs run over the emulation (tests/fakeibv/conformance.sh)
          python3-prometheus-client python3-jsonschema)  # the tests: Prometheus text parsed strictly, tool JSON against docs/schemas/
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -f "$builddir/build.ninja" ]; then
  meson setup "$builddir" -Dwerror=true "$@"
fi
ninja -C "$builddir"
