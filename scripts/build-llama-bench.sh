#!/usr/bin/env bash
# Builds two of llama.cpp's own tools from the same llama.cpp that revis
# links: `llama-bench`, the reference that `revis-bench` compares revis
# against, and `llama-batched-bench` (N parallel sequences decoded in one
# batch: prompt and generation throughput per number of sequences).
#
# llama-cpp-sys-2 vendors llama.cpp without its tools/, so `llama-bench.cpp`
# and `batched-bench.cpp` are taken from the llama-cpp-python source package
# on PyPI and compiled against the *vendored* tree of llama-cpp-sys-2, both
# with the same flags and linked against the same libraries. Everything lands
# under target/llama-bench/ (ignored by git); nothing of llama.cpp is
# committed.
#
# Two ways to get the libraries:
#   1. --llama-sys-out DIR (or $LLAMA_SYS_OUT): DIR is the OUT_DIR of the
#      llama-cpp-sys-2 build script, i.e. the very static libraries revisd is
#      linked with. The tools' sources are compiled with that build's own
#      compiler flags (read from its CMakeCache.txt) and linked against those
#      archives.
#      Same objects, same flags: the fairest comparison. Linux only.
#      `revis-bench` passes this (it learns DIR from cargo at build time).
#   2. Otherwise: configure the vendored tree with CMake the way
#      llama-cpp-sys-2's build.rs does (GGML_NATIVE=OFF, OpenMP, static libs,
#      common on, tools/tests/examples/server off, CMAKE_BUILD_TYPE
#      RelWithDebInfo as for cargo's release profile with debug info, GGML_*
#      environment variables forwarded) and build both tools with it. On
#      x86-64 ggml then enables SSE4.2/AVX/AVX2/BMI2/FMA/F16C, exactly as in
#      the crate's default build; on Apple Silicon it builds Metal.
#      Never -march=native (SIGILL in ggml's AMX code on these CPUs).
#
# Idempotent: the sdist is downloaded once, and the binaries are rebuilt only
# when the libraries they were built from changed, when one of them is
# missing, or with --force.
#
# Usage: scripts/build-llama-bench.sh [--llama-sys-out DIR] [--force]
# Env:   LLAMA_CPP_PYTHON_VERSION (default 0.3.36), REVIS_LLAMA_BENCH_DIR
#        (default target/llama-bench), JOBS (parallel compile jobs).
# Prints the path of the llama-bench binary (and nothing else) on stdout;
# llama-batched-bench lies next to it, in the same directory.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${REVIS_LLAMA_BENCH_DIR:-$ROOT/target/llama-bench}
PY_VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
SYS_VERSION=0.1.161
JOBS=${JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}
SYS_OUT=${LLAMA_SYS_OUT:-}
FORCE=0

while [ $# -gt 0 ]; do
    case "$1" in
        --llama-sys-out) SYS_OUT=$2; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
        *) echo "build-llama-bench: unknown argument $1" >&2; exit 2 ;;
    esac
done

log() { echo "build-llama-bench: $*" >&2; }
if [ -n "$SYS_OUT" ] && [ -d "$SYS_OUT" ]; then SYS_OUT=$(cd "$SYS_OUT" && pwd); fi
die() { log "$*"; exit 1; }

mkdir -p "$OUT"
BIN=$OUT/llama-bench
BBIN=$OUT/llama-batched-bench
INFO=$OUT/build-info.txt

# --- the vendored llama.cpp of llama-cpp-sys-2 -------------------------------
find_vendored() {
    local manifest=""
    if command -v cargo >/dev/null && command -v python3 >/dev/null; then
        manifest=$(cd "$ROOT" && cargo metadata --format-version 1 2>/dev/null | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "llama-cpp-sys-2" and p["version"] == sys.argv[1]:
        print(p["manifest_path"]); break
' "$SYS_VERSION" || true)
    fi
    if [ -n "$manifest" ] && [ -d "$(dirname "$manifest")/llama.cpp" ]; then
        echo "$(dirname "$manifest")/llama.cpp"
        return
    fi
    local d
    for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/llama-cpp-sys-2-"$SYS_VERSION"/llama.cpp; do
        [ -d "$d" ] && { echo "$d"; return; }
    done
    die "cannot find the vendored llama.cpp of llama-cpp-sys-2 $SYS_VERSION (run cargo fetch first)"
}
LLAMA_SRC=$(find_vendored)

# --- llama-bench.cpp and batched-bench.cpp from the llama-cpp-python sdist ---
SRC=$OUT/src
# extract_tool DIR FILE: tools/DIR/FILE of the sdist's llama.cpp -> $SRC/FILE.
extract_tool() {
    [ -s "$SRC/$2" ] && return 0
    mkdir -p "$OUT/sdist" "$SRC"
    local sdist member
    sdist=$(ls "$OUT"/sdist/llama_cpp_python-"$PY_VERSION".tar.gz 2>/dev/null || true)
    if [ -z "$sdist" ]; then
        log "downloading the llama-cpp-python $PY_VERSION source package (once)"
        python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$PY_VERSION" -d "$OUT/sdist" >&2 \
            || die "pip download of llama-cpp-python==$PY_VERSION failed (set LLAMA_CPP_PYTHON_VERSION to another version)"
        sdist=$(ls "$OUT"/sdist/llama_cpp_python-"$PY_VERSION".tar.gz)
    fi
    member="llama_cpp_python-$PY_VERSION/vendor/llama.cpp/tools/$1/$2"
    tar -xzf "$sdist" -O "$member" > "$SRC/$2.tmp" || die "$member is not in $sdist"
    mv "$SRC/$2.tmp" "$SRC/$2"
}
extract_tool llama-bench llama-bench.cpp
extract_tool batched-bench batched-bench.cpp
# Upstream, each tool's main.cpp only forwards to llama_bench() or
# llama_batched_bench() (the tool's .cpp has no main()); these do the same.
cat > "$SRC/main.cpp" <<'EOF'
// Entry point of the reference llama-bench built by scripts/build-llama-bench.sh.
int llama_bench(int argc, char ** argv);
int main(int argc, char ** argv) { return llama_bench(argc, argv); }
EOF
cat > "$SRC/main-batched-bench.cpp" <<'EOF'
// Entry point of the llama-batched-bench built by scripts/build-llama-bench.sh.
int llama_batched_bench(int argc, char ** argv);
int main(int argc, char ** argv) { return llama_batched_bench(argc, argv); }
EOF

# --- what the binary would be built from (for idempotence) --------------------
if [ -n "$SYS_OUT" ] && [ "$(uname -s)" = Linux ] && [ -f "$SYS_OUT/build/CMakeCache.txt" ]; then
    MODE=crate-libs
    KEY="mode=$MODE sdist=$PY_VERSION src=$LLAMA_SRC $(find "$SYS_OUT" -name 'lib*.a' -not -path '*/CMakeFiles/*' -print0 | sort -z | xargs -0 stat -c '%n:%s:%Y' | tr '\n' ' ')"
else
    [ -n "$SYS_OUT" ] && log "no usable llama-cpp-sys-2 build at $SYS_OUT; building the vendored tree with CMake instead"
    MODE=cmake
    KEY="mode=$MODE sdist=$PY_VERSION src=$LLAMA_SRC env=$( { env | grep '^GGML_' || true; } | sort | tr '\n' ' ')"
fi
if [ "$FORCE" = 0 ] && [ -x "$BIN" ] && [ -x "$BBIN" ] && [ -f "$OUT/key.txt" ] && [ "$(cat "$OUT/key.txt")" = "$KEY" ]; then
    log "up to date: $BIN, $BBIN"
    echo "$BIN"
    exit 0
fi

cache_get() { sed -n "s/^$1:[A-Z]*=//p" "$2" | head -n1; }
ggml_flags() { grep -E '^GGML_(NATIVE|SSE42|AVX[A-Z0-9_]*|BMI2|FMA|F16C|OPENMP|METAL|BLAS|CPU_ARM_ARCH):' "$1" | sed 's/:[A-Z]*=/=/' | tr '\n' ' '; }

if [ "$MODE" = crate-libs ]; then
    cache=$SYS_OUT/build/CMakeCache.txt
    btype=$(cache_get CMAKE_BUILD_TYPE "$cache")
    btype_uc=$(echo "${btype:-Release}" | tr '[:lower:]' '[:upper:]')
    cxx=$(cache_get CMAKE_CXX_COMPILER "$cache"); cxx=${cxx:-c++}
    # shellcheck disable=SC2206
    cxxflags=($(cache_get CMAKE_CXX_FLAGS "$cache") $(cache_get "CMAKE_CXX_FLAGS_$btype_uc" "$cache"))
    libs=()
    for name in llama-common llama-common-base cpp-httplib vendor-hash llama ggml ggml-cpu ggml-rpc ggml-base; do
        f=$(find "$SYS_OUT" -name "lib$name.a" -not -path '*/CMakeFiles/*' | head -n1)
        [ -n "$f" ] && libs+=("$f")
    done
    [ ${#libs[@]} -ge 5 ] || die "the llama-cpp-sys-2 build at $SYS_OUT lacks libllama/libggml*/libllama-common archives"
    extra=(-lpthread -ldl -lm)
    [ "$(cache_get GGML_OPENMP "$cache")" = ON ] && extra=(-fopenmp "${extra[@]}")
    httplib=$(find "$SYS_OUT" -name libcpp-httplib.a -not -path '*/CMakeFiles/*' | head -n1)
    if [ -n "$httplib" ] && nm "$httplib" 2>/dev/null | grep ' U SSL_' >/dev/null; then extra+=(-lssl -lcrypto); fi
    incs=(-I"$LLAMA_SRC/include" -I"$LLAMA_SRC/common" -I"$LLAMA_SRC/ggml/include" -I"$LLAMA_SRC/vendor")
    log "compiling llama-bench.cpp and batched-bench.cpp against $SYS_OUT ($btype: ${cxxflags[*]})"
    "$cxx" -std=c++17 "${cxxflags[@]}" "${incs[@]}" -c "$SRC/llama-bench.cpp" -o "$OUT/llama-bench.o"
    "$cxx" -std=c++17 "${cxxflags[@]}" "${incs[@]}" -c "$SRC/batched-bench.cpp" -o "$OUT/batched-bench.o"
    "$cxx" -std=c++17 "${cxxflags[@]}" -c "$SRC/main.cpp" -o "$OUT/main.o"
    "$cxx" -std=c++17 "${cxxflags[@]}" -c "$SRC/main-batched-bench.cpp" -o "$OUT/main-batched-bench.o"
    "$cxx" "$OUT/main.o" "$OUT/llama-bench.o" -Wl,--start-group "${libs[@]}" -Wl,--end-group "${extra[@]}" -Wl,--gc-sections -o "$BIN.tmp"
    "$cxx" "$OUT/main-batched-bench.o" "$OUT/batched-bench.o" -Wl,--start-group "${libs[@]}" -Wl,--end-group "${extra[@]}" -Wl,--gc-sections -o "$BBIN.tmp"
    mv "$BIN.tmp" "$BIN"
    mv "$BBIN.tmp" "$BBIN"
    {
        echo "llama-bench.cpp, batched-bench.cpp: llama-cpp-python $PY_VERSION sdist"
        echo "libraries: the llama-cpp-sys-2 $SYS_VERSION build that revis links ($SYS_OUT)"
        echo "build type: $btype; flags: $(cache_get CMAKE_CXX_FLAGS "$cache")"
        echo "ggml: $(ggml_flags "$cache")"
    } > "$INFO"
else
    # A small CMake project that builds the vendored tree as a subproject with
    # the options llama-cpp-sys-2's build.rs passes, plus the llama-bench target.
    proj=$OUT/cmake-project
    mkdir -p "$proj"
    cat > "$proj/CMakeLists.txt" <<EOF
# Generated by scripts/build-llama-bench.sh: builds llama-bench and
# llama-batched-bench against the llama.cpp vendored by llama-cpp-sys-2 $SYS_VERSION.
cmake_minimum_required(VERSION 3.14)
project(revis_llama_bench C CXX)
add_subdirectory("$LLAMA_SRC" llama.cpp EXCLUDE_FROM_ALL)
add_executable(llama-bench "$SRC/main.cpp" "$SRC/llama-bench.cpp")
target_link_libraries(llama-bench PRIVATE llama-common llama \${CMAKE_THREAD_LIBS_INIT})
target_compile_features(llama-bench PRIVATE cxx_std_17)
add_executable(llama-batched-bench "$SRC/main-batched-bench.cpp" "$SRC/batched-bench.cpp")
target_link_libraries(llama-batched-bench PRIVATE llama-common llama \${CMAKE_THREAD_LIBS_INIT})
target_compile_features(llama-batched-bench PRIVATE cxx_std_17)
EOF
    args=(
        -DCMAKE_BUILD_TYPE=RelWithDebInfo
        -DBUILD_SHARED_LIBS=OFF
        -DGGML_NATIVE=OFF
        -DGGML_OPENMP=ON
        -DLLAMA_BUILD_COMMON=ON
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
        -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF
    )
    case "$(uname -s)-$(uname -m)" in
        Linux-x86_64)
            # What the cc crate (and so the crate's CMake call) uses as baseline flags.
            args+=("-DCMAKE_C_FLAGS=-ffunction-sections -fdata-sections -fPIC -m64 -march=x86-64"
                   "-DCMAKE_CXX_FLAGS=-ffunction-sections -fdata-sections -fPIC -m64 -march=x86-64") ;;
        Darwin-*)
            args+=(-DGGML_BLAS=OFF -DGGML_OPENMP=OFF) ;;
    esac
    # Like build.rs: GGML_* variables of the environment become CMake options.
    while IFS='=' read -r k v; do
        [ -n "$k" ] && args+=("-D$k=$v")
    done < <(env | grep '^GGML_' || true)
    log "configuring the vendored llama.cpp ($LLAMA_SRC) with CMake"
    cmake -S "$proj" -B "$OUT/build" "${args[@]}" >&2
    log "building llama + ggml + llama-bench + llama-batched-bench with $JOBS jobs (several minutes on 2 cores)"
    cmake --build "$OUT/build" --target llama-bench llama-batched-bench -j "$JOBS" >&2
    cp "$OUT/build/llama-bench" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
    cp "$OUT/build/llama-batched-bench" "$BBIN.tmp" && mv "$BBIN.tmp" "$BBIN"
    {
        echo "llama-bench.cpp, batched-bench.cpp: llama-cpp-python $PY_VERSION sdist"
        echo "libraries: the vendored llama.cpp of llama-cpp-sys-2 $SYS_VERSION, built by CMake here ($LLAMA_SRC)"
        echo "build type: RelWithDebInfo; flags: $(cache_get CMAKE_CXX_FLAGS "$OUT/build/CMakeCache.txt")"
        echo "ggml: $(ggml_flags "$OUT/build/CMakeCache.txt")"
    } > "$INFO"
fi
"$BIN" --help >/dev/null 2>&1 || die "the built $BIN does not run"
"$BBIN" --help >/dev/null 2>&1 || die "the built $BBIN does not run"
echo "$KEY" > "$OUT/key.txt"
log "built $BIN and $BBIN"
cat "$INFO" >&2
echo "$BIN"
