#!/usr/bin/env bash
# Downloads (here, where Debian's mirror is reachable) the .deb packages the
# build needs, into .devdeps/ (git-ignored), so that the GPU machine, which
# reaches no registry and lacks them, can unpack them: the device tool's run
# carries .devdeps and tests/gpu/run_device_checks.sh unpacks it.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.devdeps/' .git/info/exclude 2>/dev/null || echo '/.devdeps/' >>.git/info/exclude
mkdir -p .devdeps
apt-get update -qq
cd .devdeps
apt-get download -qq \
  libabsl-dev libabsl20220623 libgtest-dev libgmock-dev googletest \
  libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev libgfortran5 \
  nlohmann-json3-dev libcli11-dev pkgconf pkgconf-bin libpkgconf3 meson ninja-build \
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libhwloc15 libevent-core-2.1-7 \
  libevent-pthreads-2.1-7 libpmix2 libfabric1 libucx0 libnl-3-200 libnl-route-3-200 \
  libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libxnvctrl0 libmunge2 libltdl7 \
  2>/dev/null || true
du -sh .
ls | wc -l
