#!/usr/bin/env bash
# Builds, once, the upstream binaries the end-to-end tests run, from the Go module proxy:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kwok, helm,
#   the real node's container runtime: containerd 2 (daemon, runc shim, ctr), and promqlcheck
#   (Prometheus's PromQL parser and engine as a test binary, ../../tests/support/promqlcheck);
#   and promtool, unpacked from Debian's prometheus package (install_promtool below).
# They land in a cache outside the repository, keyed by version, so a second run builds nothing:
#   ${GPUSHARE_CACHE:-~/.cache/gpushare}/bin/<component>-<version>/<binary>
# It prints the directory of each binary set; `bin-dir` prints one line PATH entries for all.
# K8S_VERSION picks the Kubernetes release (default the newest tested); each release it accepts
# is pinned by a module directory here whose go.mod requires it: kubernetes/ for the newest,
# kubernetes-1.<minor>/ for the oldest supported minor (docs/compatibility.md).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
# containerd 2 for the real node (CDI on by default, the config format GPU nodes run today);
# runc stays Debian's. About 4 minutes cold on 2 cores, 115 MB of binaries.
CONTAINERD_VERSION=v2.2.9
CACHE="${GPUSHARE_CACHE:-$HOME/.cache/gpushare}/bin"

# Go 1.27 turns on jsonv2, which breaks kube-openapi's output; pin the local Go 1.26 toolchain.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
case "$(go env GOVERSION)" in
  go1.26*) ;;
  go1.27*|go1.28*) export GOEXPERIMENT=nojsonv2 ;;
esac

log() { printf '[controlplane] %s\n' "$*" >&2; }

# The module directory whose go.mod pins k8s.io/kubernetes at exactly K8S_VERSION, so that a
# version is only ever built from the go.sum that was checked for it.
kubernetes_module() {
  local dir
  for dir in "$HERE"/kubernetes "$HERE"/kubernetes-1.*; do
    if grep -Eq "^(require )?[[:space:]]*k8s\.io/kubernetes $K8S_VERSION\$" "$dir/go.mod" 2>/dev/null; then
      echo "$dir"; return
    fi
  done
  log "K8S_VERSION=$K8S_VERSION: no go.mod under $HERE requires k8s.io/kubernetes $K8S_VERSION;" \
      "pick one that does ($(cd "$HERE" && grep -ho 'k8s.io/kubernetes v[0-9.]*$' kubernetes*/go.mod | \
      cut -d' ' -f2 | xargs)) or add a kubernetes-1.<minor>/ module for it"
  exit 2
}

build_kubernetes() {
  local out="$CACHE/kubernetes-$K8S_VERSION"
  if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-scheduler" ] && \
     [ -x "$out/kube-controller-manager" ] && [ -x "$out/kubectl" ] && [ -x "$out/kubelet" ]; then
    echo "$out"; return
  fi
  log "building Kubernetes $K8S_VERSION from $K8S_MODULE (kube-apiserver alone takes about 3 minutes and 2 GiB)"
  local start=$SECONDS tmp="$out.tmp.$$"
  mkdir -p "$tmp"
  (cd "$K8S_MODULE" && go build -trimpath -o "$tmp/" \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet)
  rm -rf "$out" && mv "$tmp" "$out"
  log "Kubernetes built in $((SECONDS - start)) s"
  echo "$out"
}

build_etcd() {
  local out="$CACHE/etcd-$ETCD_VERSION"
  if [ -x "$out/etcd" ]; then echo "$out"; return; fi
  log "building etcd $ETCD_VERSION"
  local start=$SECONDS
  mkdir -p "$out"
  (cd "$HERE/etcd" && go build -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" .)
  mv "$out/etcd.tmp" "$out/etcd"
  log "etcd built in $((SECONDS - start)) s"
  echo "$out"
}

install_module() {  # name package version binary
  local out="$CACHE/$1-$3"
  if [ -x "$out/$4" ]; then echo "$out"; return; fi
  log "building $1 $3"
  local start=$SECONDS
  mkdir -p "$out.tmp.$$"
  GOBIN="$out.tmp.$$" go install -trimpath -ldflags "-s -w" "$2@$3"
  rm -rf "$out" && mv "$out.tmp.$$" "$out"
  log "$1 built in $((SECONDS - start)) s"
  echo "$out"
}

build_containerd() {
  local out="$CACHE/containerd-$CONTAINERD_VERSION" module=github.com/containerd/containerd/v2
  if [ -x "$out/containerd" ] && [ -x "$out/containerd-shim-runc-v2" ] && [ -x "$out/ctr" ]; then
    echo "$out"; return
  fi
  log "building containerd $CONTAINERD_VERSION"
  local start=$SECONDS tmp="$out.tmp.$$"
  mkdir -p "$tmp"
  # Without cgo the btrfs snapshotter drops out (the real node uses overlayfs) and the shim is
  # static, as upstream builds it.
  GOBIN="$tmp" go install -trimpath \
    -ldflags "-s -w -X $module/version.Version=$CONTAINERD_VERSION" \
    "$module/cmd/containerd@$CONTAINERD_VERSION" \
    "$module/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "$module/cmd/ctr@$CONTAINERD_VERSION"
  rm -rf "$out" && mv "$tmp" "$out"
  log "containerd built in $((SECONDS - start)) s"
  echo "$out"
}

# Prometheus's own parser and engine, for the dashboard's and the alerts' PromQL: a test binary
# of the promql and promqltest packages (tests/support/promqlcheck), not promtool, whose service
# discoveries and cloud SDKs took 23 minutes on 2 cores; this took 266 s cold (820 MB of
# modules fetched) and seconds warm. Keyed by the hash of its sources, so an edit rebuilds it.
build_promqlcheck() {
  local src="$HERE/../../tests/support/promqlcheck" key
  key="$(cat "$src/go.mod" "$src/go.sum" "$src/check_test.go" | sha256sum | cut -c1-12)"
  local out="$CACHE/promqlcheck-$key"
  if [ -x "$out/promqlcheck.test" ]; then echo "$out"; return; fi
  log "building promqlcheck $key"
  local start=$SECONDS
  mkdir -p "$out"
  (cd "$src" && go test -c -trimpath -ldflags "-s -w" -o "$out/promqlcheck.test.tmp" .)
  mv "$out/promqlcheck.test.tmp" "$out/promqlcheck.test"
  log "promqlcheck built in $((SECONDS - start)) s"
  echo "$out"
}

# promtool, for `promtool test rules` on the chart's alerts (tests/integration/chart/test_alert_rules.py): taken
# from Debian's prometheus package (the registry these machines reach; seconds, 19 MB), unpacked
# into the cache rather than installed, so no Prometheus server is set up as a service. Building
# it from source pulls every service discovery's cloud SDK (23 minutes on 2 cores, above).
# Where apt-get is missing or the download fails, it is left out with a note, and the tests that
# need it say how to get it; nothing else depends on it.
PROMTOOL_DEB="${PROMTOOL_DEB:-prometheus=2.42.0+ds-5+deb12u1}"
install_promtool() {
  local found
  found="$(ls -d "$CACHE"/promtool-*/ 2>/dev/null | head -n1)"
  if [ -n "$found" ] && [ -x "$found/promtool" ]; then echo "${found%/}"; return; fi
  if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    log "promtool left out: no apt-get/dpkg-deb here (the alert tests that need it skip)"
    return
  fi
  local tmp version
  tmp="$(mktemp -d)"
  if ! (cd "$tmp" && { apt-get download "$PROMTOOL_DEB" >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && apt-get download "$PROMTOOL_DEB" >/dev/null 2>&1; } \
        || apt-get download prometheus >/dev/null 2>&1; }); then
    log "promtool left out: apt-get download prometheus failed (the alert tests that need it skip)"
    rm -rf "$tmp"; return
  fi
  version="$(dpkg-deb -f "$tmp"/prometheus_*.deb Version | cut -d+ -f1)"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  mkdir -p "$CACHE/promtool-$version"
  mv "$tmp/x/usr/bin/promtool" "$CACHE/promtool-$version/promtool"
  rm -rf "$tmp"
  log "promtool $version unpacked from Debian's prometheus package"
  echo "$CACHE/promtool-$version"
}

main() {
  K8S_MODULE="$(kubernetes_module)"  # before any build: an unpinned version fails at once
  mkdir -p "$CACHE"
  build_etcd
  build_kubernetes
  install_module kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" kwok
  install_module helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" helm
  build_containerd
  build_promqlcheck
  install_promtool || true
}

main "$@"
