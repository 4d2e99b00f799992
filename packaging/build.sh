#!/usr/bin/env bash
# Build the frozen guest agent with a pinned PyInstaller.
#
#   packaging/build.sh [DIST_DIR]        (default DIST_DIR: <repo>/dist)
#
# Result: DIST_DIR/vmr-handler/vmr-handler (onedir bundle, see vmr-handler.spec for why).
# Environment: PYTHON (default <repo>/.venv/bin/python; needs a shared libpython),
# VMR_BUILD_WORK (PyInstaller work dir, default <repo>/build/pyinstaller),
# VMR_PYI_MODE=onefile (the rejected variant, only to reproduce the comparison).
set -euo pipefail

PYINSTALLER_VERSION=6.22.3          # keep in sync with the `test` extra in pyproject.toml
HOOKS_CONTRIB_VERSION=2026.9

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
python=${PYTHON:-$repo/.venv/bin/python}
dist=${1:-$repo/dist}
work=${VMR_BUILD_WORK:-$repo/build/pyinstaller}
mkdir -p "$dist" "$work"
dist=$(cd "$dist" && pwd)
work=$(cd "$work" && pwd)

have=$("$python" -c 'import PyInstaller; print(PyInstaller.__version__)' 2>/dev/null || true)
if [ "$have" != "$PYINSTALLER_VERSION" ]; then
    "$python" -m pip install -q "pyinstaller==$PYINSTALLER_VERSION" \
        "pyinstaller-hooks-contrib==$HOOKS_CONTRIB_VERSION"
fi
# The spec copies vmr-handler's metadata: the package must be installed in this Python.
if ! "$python" -c 'import importlib.metadata as m; m.version("vmr-handler")' 2>/dev/null; then
    "$python" -m pip install -q -e "$repo"
fi

# Reproducible output: a fixed hash seed for the bytecode and PyInstaller's own data
# structures (PyInstaller docs, "Creating a Reproducible Build"), and the reproducible-builds
# SOURCE_DATE_EPOCH (honoured by py_compile, and by PyInstaller for timestamps it writes).
export PYTHONHASHSEED=0
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 1700000000)}
export SOURCE_DATE_EPOCH

cd "$repo"
if ! "$python" -m PyInstaller --noconfirm --clean --log-level WARN \
        --distpath "$dist" --workpath "$work" "$here/vmr-handler.spec"; then
    echo "build.sh: PyInstaller failed. It needs a Python with a shared libpython" \
         "(pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared; Debian: the libpython3.X package)" >&2
    exit 1
fi

if [ "${VMR_PYI_MODE:-onedir}" = onefile ]; then
    exe=$dist/vmr-handler
else
    exe=$dist/vmr-handler/vmr-handler
fi
"$exe" --version
echo "built $exe"
