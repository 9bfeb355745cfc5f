# Sourced by scripts/test.sh and scripts/demo.sh (from the repository root). Sets MZ_CCACHE=1 and
# ccache's settings when ccache is installed (deps.sh installs it); leaves MZ_CCACHE empty otherwise,
# and the builds then run the compiler directly. MZ_NO_CCACHE=1 turns it off.
#   base_dir = this tree: absolute paths under it are rewritten relative, so clones in other folders
#              (CI's fresh clone) hit the same entries;
#   hash_dir = false: the build directory (in -g debug info) is not hashed, for the same reason;
#   the cache lives in ~/.cache/mzcache/ccache beside the dependency build, capped at 5 GiB.
MZ_CCACHE=
if [ "${MZ_NO_CCACHE:-0}" != 1 ] && command -v ccache >/dev/null 2>&1; then
  MZ_CCACHE=1
  export CCACHE_DIR=${CCACHE_DIR:-${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/ccache}
  export CCACHE_BASEDIR=$PWD
  export CCACHE_NOHASHDIR=1
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
fi
