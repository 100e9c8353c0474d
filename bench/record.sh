# Sourced by the bench scripts: what every results file records about its run, as a Markdown list.
#   bench_record <build-dir>
bench_record() {
  local build=$1 root torch_dir
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  torch_dir=$(sed -n 's/^DTENSOR_TORCH_DIR:PATH=//p' "$build/CMakeCache.txt")
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- Commit: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- src include bench ':!bench/results' examples CMakeLists.txt || echo ' plus uncommitted changes')"
  echo "- Build: $(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt"), $(sed -n 's/^CMAKE_CXX_COMPILER_ID \(.*\)/\1/p; s/^set(CMAKE_CXX_COMPILER_ID "\(.*\)")/\1/p' "$build"/CMakeFiles/*/CMakeCXXCompiler.cmake | head -1) $(sed -n 's/^set(CMAKE_CXX_COMPILER_VERSION "\(.*\)")/\1/p' "$build"/CMakeFiles/*/CMakeCXXCompiler.cmake | head -1)"
  echo "- LibTorch: $(sed -n "s/^__version__ = '\(.*\)'.*/\1/p" "$torch_dir/version.py")$(mpirun --version 2>/dev/null | head -1 | sed 's/^/; /')"
  echo "- Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) RAM, Linux $(uname -r); load average before the run $(cut -d' ' -f1-3 /proc/loadavg)"
}

# Sourced by the bench scripts too: runs a benchmark on a backend.
#   on_backend gloo|default COMMAND...   (gloo: with DTENSOR_BACKEND=gloo; default: the launcher's choice)
on_backend() {
  local backend=$1
  shift
  if [[ $backend == gloo ]]; then DTENSOR_BACKEND=gloo "$@"; else "$@"; fi
}
