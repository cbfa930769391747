#!/usr/bin/env bash
# Build llama.cpp's llama-batched-bench and llama-server (CPU, Release, -march=native)
# from the llama.cpp that llama-cpp-python's sdist vendors, so the C++ peer and the
# Python binding (`pip install --no-binary llama-cpp-python llama-cpp-python==VERSION`)
# run the very same llama.cpp.
#
#   benchmarks/peers/build_llama_cpp.sh [OUT_DIR]       # default /work/peers/llama.cpp-$VERSION
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  sdist to build from (default 0.3.36)
#   JOBS                      parallel compile jobs (default: nproc)
#   NICE                      prefix for the heavy steps (default "nice -n 19"; "" to run at normal priority)
#   PIP                       pip to download with (default: the repo's .venv/bin/pip, else python3 -m pip)
#   CMAKE_ARGS                extra configure flags, e.g. "-DGGML_CUDA=ON" on a GPU machine
#   LLAMA_SMOKE_MODEL         a GGUF file: run llama-batched-bench on it once built (exit 2 if it crashes)
#
# Idempotent: the sdist is downloaded and unpacked once, cmake re-runs only what changed.
# It prints the two binary paths last; point benchmarks/peers.py at them with
# --llama-cpp-dir OUT_DIR (or FASTMODE_LLAMA_CPP_DIR=OUT_DIR).
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
OUT="${1:-/work/peers/llama.cpp-${VERSION}}"
JOBS="${JOBS:-$(nproc)}"
NICE="${NICE-nice -n 19}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -z "${PIP:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/pip" ]]; then PIP="$REPO/.venv/bin/pip"; else PIP="python3 -m pip"; fi
fi
for tool in cmake tar; do
    command -v "$tool" >/dev/null || { echo "build_llama_cpp.sh: $tool is required" >&2; exit 2; }
done
GENERATOR=()
if command -v ninja >/dev/null; then GENERATOR=(-G Ninja); fi

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SDIST="$OUT/llama_cpp_python-${VERSION}.tar.gz"
SRC="$OUT/llama_cpp_python-${VERSION}"
BUILD="$OUT/build"

if [[ ! -f "$SDIST" ]]; then
    echo "== downloading the llama-cpp-python ${VERSION} sdist"
    $PIP download --no-binary :all: --no-deps "llama-cpp-python==${VERSION}" -d "$OUT"
fi
if [[ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]]; then
    echo "== unpacking $SDIST"
    tar -xzf "$SDIST" -C "$OUT"
fi

# Offline-safe: no curl, no OpenSSL, no web UI download (llama-server then serves a stub page;
# the API is unaffected), no tests or examples.
echo "== configuring in $BUILD"
# shellcheck disable=SC2086
$NICE cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF ${CMAKE_ARGS:-}

echo "== building llama-batched-bench, llama-server and llama-quantize with $JOBS jobs"
start=$(date +%s)
$NICE cmake --build "$BUILD" -j"$JOBS" --target llama-batched-bench llama-server llama-quantize
echo "== build step took $(( $(date +%s) - start )) s"

BIN="$BUILD/bin"
for b in llama-batched-bench llama-server llama-quantize; do
    [[ -x "$BIN/$b" ]] || { echo "build_llama_cpp.sh: $BIN/$b was not produced" >&2; exit 1; }
done
# Smoke test: a few tokens on a tiny prompt. llama.cpp's AMX matmul (compiled in by -march=native
# on CPUs that list AMX) crashed in a 2-vCPU Firecracker VM whose Xeon lists AMX (SIGSEGV in
# ggml_backend_amx_mul_mat at ldtilecfg), though AMX itself runs there: say how to build without it.
MODEL="${LLAMA_SMOKE_MODEL:-}"
if [[ -n "$MODEL" && -f "$MODEL" ]]; then
    if ! "$BIN/llama-batched-bench" -m "$MODEL" -c 256 -npp 8 -ntg 2 -npl 1 -t 2 >/dev/null 2>&1; then
        echo "build_llama_cpp.sh: WARNING: llama-batched-bench crashed on $MODEL. Where the CPU lists AMX," >&2
        echo "  rebuild into another dir without it: CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON" >&2
        echo "  -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON" >&2
        echo "  -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF'" >&2
        exit 2
    fi
    echo "== smoke test passed on $MODEL"
fi
echo "llama.cpp (vendored by llama-cpp-python ${VERSION}) built:"
echo "$BIN/llama-batched-bench"
echo "$BIN/llama-server"
