#!/usr/bin/env bash
# `pip install --no-build-isolation .` from a copy of the source tree into a fresh venv with
# --system-site-packages (Debian's torch), then, outside the tree, the torch suite's collectives
# check against the installed braid_torch and the braid command from the venv. Usage: test_pip_install.sh SOURCE_ROOT
set -uo pipefail
src=$1
unset PYTHONPATH LD_LIBRARY_PATH  # (the build tree's braid_torch must not be what is imported)
python=/usr/bin/python3
if ! "$python" -c "import mesonpy, torch, venv, pip" 2>/dev/null; then
  echo "SKIP: needs python3-mesonpy, python3-venv, python3-pip and python3-torch for $python (tools/setup.sh installs them)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The source files (tracked, or new and not ignored): the build trees beside them are not the
# package. (Outside a git checkout, as in tools/torch2-check's copy: everything but build*/.)
mkdir -p "$work/src"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" ls-files -z --cached --others --exclude-standard | (cd "$src" && tar --null -T - -cf -) | tar -xf - -C "$work/src" || exit 1
else
  (cd "$src" && tar --exclude='./build*' -cf - .) | tar -xf - -C "$work/src" || exit 1
fi
"$python" -m venv --system-site-packages "$work/venv" || exit 1
start=$(date +%s)
if ! "$work/venv/bin/pip" install --no-build-isolation --no-deps "$work/src" >"$work/pip.log" 2>&1; then
  tail -40 "$work/pip.log"
  echo "FAIL: pip install"
  exit 1
fi
echo "pip install: $(($(date +%s) - start)) s"
cd "$work" || exit 1
"$work/venv/bin/python" "$src/tests/install/installed_backend.py" || { echo "FAIL: braid_torch from the venv"; exit 1; }
case $("$work/venv/bin/python" -c "import braid_torch; print(braid_torch.__file__)") in
  "$work/venv/"*) ;;
  *) echo "FAIL: braid_torch was not imported from the venv"; exit 1 ;;
esac
"$work/venv/bin/braid" --version || { echo "FAIL: the braid command from the venv"; exit 1; }
echo "ok: installed into a fresh venv; every collective exact on 1 to 4 ranks from it; the braid command runs"
