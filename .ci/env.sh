# Sourced by the build scripts: finds nvcc and picks the CUDA setting.
# CUDA is compiled whenever nvcc is present (a CUDA compile error must fail
# the build); without nvcc the host-only build is configured explicitly.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if command -v nvcc >/dev/null 2>&1; then
  MLAG_CUDA_OPTION=enabled
else
  MLAG_CUDA_OPTION=disabled
fi
# Configures build directory $1 with extra options, or reconfigures it.
mlag_setup() {
  local dir="$1"; shift
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@"
  fi
}
