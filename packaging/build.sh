#!/usr/bin/env bash
# Build the frozen guest agent with a pinned PyInstaller.
#
#   packaging/build.sh [--onedir] [--compress] [--without-signatures] [--runtime-tmpdir DIR] [DIST_DIR]
#                                                                      (default DIST_DIR: <repo>/dist)
#
# Result: DIST_DIR/vmr-handler, ONE executable file (PyInstaller onefile; see vmr-handler.spec
# for how it avoids leaking unpacked copies and orphans). --onedir builds the directory
# bundle DIST_DIR/vmr-handler/vmr-handler (+ _internal/) instead. --runtime-tmpdir DIR bakes
# the directory the single file unpacks into (absolute, no variables; the bootloader fails
# when it cannot create it); default: $TMPDIR at run time, else /tmp. --compress stores the
# single file's parts zlib-compressed: 14 MB instead of 32 MB, but every start inflates them
# (+0.1 s on the host, +1.4 s in a TCG guest; packaging/README.md). --without-signatures leaves
# out `cryptography` (11.6 MB less to unpack at every start): that agent cannot check the host's
# Ed25519 signatures and refuses to start when a public_key is configured.
# Environment: PYTHON (default <repo>/.venv/bin/python; needs a shared libpython),
# VMR_BUILD_WORK (PyInstaller work dir, default <repo>/build/pyinstaller),
# VMR_PYI_MODE=onefile|onedir, VMR_PYI_COMPRESS=0|1, VMR_PYI_SIGNATURES=1|0 (the same as the
# options; options win).
set -euo pipefail

mode=${VMR_PYI_MODE:-onefile}
runtime_tmpdir=${VMR_RUNTIME_TMPDIR:-}
compress=${VMR_PYI_COMPRESS:-0}
signatures=${VMR_PYI_SIGNATURES:-1}
while [ $# -gt 0 ]; do
    case $1 in
        --onedir) mode=onedir; shift ;;
        --onefile) mode=onefile; shift ;;
        --compress) compress=1; shift ;;
        --without-signatures) signatures=0; shift ;;
        --runtime-tmpdir) [ $# -ge 2 ] || { echo "build.sh: --runtime-tmpdir needs a directory" >&2; exit 2; }
                          runtime_tmpdir=$2; shift 2 ;;
        -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}"; exit 0 ;;
        -*) echo "build.sh: unknown option $1 (see packaging/build.sh --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
case $mode in onefile|onedir) ;; *) echo "build.sh: VMR_PYI_MODE must be onefile or onedir, not $mode" >&2; exit 2 ;; esac
case $signatures in 0|1) ;; *) echo "build.sh: VMR_PYI_SIGNATURES must be 1 or 0, not $signatures" >&2; exit 2 ;; esac
if [ -n "$runtime_tmpdir" ]; then
    [ "$mode" = onefile ] || { echo "build.sh: --runtime-tmpdir applies to the single file, not --onedir" >&2; exit 2; }
    case $runtime_tmpdir in /*) ;; *) echo "build.sh: --runtime-tmpdir must be absolute: $runtime_tmpdir" >&2; exit 2 ;; esac
fi
export VMR_PYI_MODE=$mode VMR_RUNTIME_TMPDIR=$runtime_tmpdir VMR_PYI_COMPRESS=$compress VMR_PYI_SIGNATURES=$signatures

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

# A build of the other kind in the same place: a onefile build writes the file
# DIST_DIR/vmr-handler where a onedir build has its directory, and the reverse.
if [ "$mode" = onefile ] && [ -d "$dist/vmr-handler" ]; then
    rm -rf "$dist/vmr-handler"
elif [ "$mode" = onedir ] && [ -f "$dist/vmr-handler" ]; then
    rm -f "$dist/vmr-handler"
fi

cd "$repo"
if ! "$python" -m PyInstaller --noconfirm --clean --log-level WARN \
        --distpath "$dist" --workpath "$work" "$here/vmr-handler.spec"; then
    echo "build.sh: PyInstaller failed. It needs a Python with a shared libpython" \
         "(pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared; Debian: the libpython3.X package)" >&2
    exit 1
fi

if [ "$mode" = onefile ]; then
    exe=$dist/vmr-handler
else
    exe=$dist/vmr-handler/vmr-handler
fi
"$exe" --version
echo "built $exe"
