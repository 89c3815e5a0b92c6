#!/usr/bin/env bash
# Installs, once, what the real node of the end-to-end tests needs from Debian's packages:
# runc (the OCI runtime under containerd 2, which controlplane/build.sh builds), containerd 1.6
# (the envvar smoke test's runtime without CDI), the CNI plugins (bridge, host-local, loopback),
# busybox-static (the root filesystem of the local images), gcc (the dynamically linked probe),
# mmdebstrap (the Debian root filesystems of the chart's images, harness/image_archive.py).
# kubelet and containerd 2 are built from pinned Go modules by controlplane/build.sh.
# Without root it installs nothing and says what is missing; the real-node tests then skip.
set -euo pipefail

missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
{ [ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked'; } \
  || missing+=(busybox-static)
command -v gcc >/dev/null || missing+=(gcc)
command -v file >/dev/null || missing+=(file)
command -v ip >/dev/null || missing+=(iproute2)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)

if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "[realnode] missing Debian packages: ${missing[*]} (run as root to install them);" \
       "the real-node tests will skip" >&2
  exit 0
fi
echo "[realnode] installing ${missing[*]} from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
