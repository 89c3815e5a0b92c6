#!/usr/bin/env bash
# Builds, once, the node autoscalers the autoscaling end-to-end tests run beside gpushare:
#   cluster-autoscaler (its kwok cloud provider only) from ../shared/vendor's source tarball,
#     which the Go module proxy does not serve (../shared/vendor/README.md);
#   Karpenter's kwok provider (sigs.k8s.io/karpenter/kwok), pinned by ./karpenter/go.mod,
#     with its CRDs (NodePool, NodeClaim, NodeOverlay, KWOKNodeClass) copied from the module.
# Cached like build.sh's binaries, keyed by version, so a second run builds nothing:
#   ${GPUSHARE_CACHE:-~/.cache/gpushare}/bin/<name>-<version>/
# It prints the directory of each set it has. Without the vendored tarball (no ../shared beside
# the project; GPUSHARE_SHARED names another place) it skips cluster-autoscaler and says so on
# stderr; the tests that need it skip with that reason.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CA_VERSION=1.36.1
KARPENTER_VERSION=v1.15.0
# Karpenter v1.15.0's go.mod asks for Go 1.26.9, newer than this machine's 1.26.8; the module
# proxy serves go1.27.3. The local toolchain builds cluster-autoscaler (go 1.26.0).
KARPENTER_TOOLCHAIN=go1.27.3
SHARED="${GPUSHARE_SHARED:-$HERE/../../../shared}"
CA_TARBALL="$SHARED/vendor/cluster-autoscaler-$CA_VERSION.tar.gz"
CACHE="${GPUSHARE_CACHE:-$HOME/.cache/gpushare}/bin"

export CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf '[autoscalers] %s\n' "$*" >&2; }

# Go 1.27 turns jsonv2 on; both autoscalers are written for and tested on Go 1.26's
# encoding/json, so a 1.27 toolchain builds them with it off, as build.sh does.
json_experiment() {  # toolchain
  case "$(GOTOOLCHAIN="$1" go env GOVERSION)" in
    go1.27*|go1.28*) echo nojsonv2 ;;
    *) echo "" ;;
  esac
}

build_cluster_autoscaler() {
  local out="$CACHE/cluster-autoscaler-$CA_VERSION"
  if [ -x "$out/cluster-autoscaler" ]; then echo "$out"; return; fi
  if [ ! -f "$CA_TARBALL" ]; then
    log "skipping cluster-autoscaler $CA_VERSION: no source at $CA_TARBALL" \
        "(put ../shared beside the project, or set GPUSHARE_SHARED)"
    return
  fi
  log "building cluster-autoscaler $CA_VERSION (kwok provider) from $CA_TARBALL"
  local start=$SECONDS tmp="$out.tmp.$$"
  mkdir -p "$tmp/src"
  tar -xzf "$CA_TARBALL" -C "$tmp/src"
  (cd "$tmp/src/cluster-autoscaler" && GOTOOLCHAIN=local GOEXPERIMENT="$(json_experiment local)" \
    go build -trimpath -ldflags "-s -w" -tags kwok -o "$tmp/cluster-autoscaler" .)
  rm -rf "$tmp/src"
  rm -rf "$out" && mv "$tmp" "$out"
  log "cluster-autoscaler built in $((SECONDS - start)) s"
  echo "$out"
}

build_karpenter() {
  local out="$CACHE/karpenter-kwok-$KARPENTER_VERSION"
  if [ -x "$out/karpenter-kwok" ] && [ -d "$out/crds" ]; then echo "$out"; return; fi
  log "building Karpenter $KARPENTER_VERSION (kwok provider) with $KARPENTER_TOOLCHAIN"
  local start=$SECONDS tmp="$out.tmp.$$"
  mkdir -p "$tmp/crds"
  (cd "$HERE/karpenter" && GOTOOLCHAIN=$KARPENTER_TOOLCHAIN \
    GOEXPERIMENT="$(json_experiment $KARPENTER_TOOLCHAIN)" \
    go build -trimpath -ldflags "-s -w" -o "$tmp/karpenter-kwok" sigs.k8s.io/karpenter/kwok)
  local module
  module="$(cd "$HERE/karpenter" && GOTOOLCHAIN=$KARPENTER_TOOLCHAIN \
    go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)"
  cp "$module"/kwok/charts/crds/karpenter.sh_*.yaml "$module"/kwok/apis/crds/*.yaml "$tmp/crds/"
  chmod -R u+w "$tmp/crds"
  rm -rf "$out" && mv "$tmp" "$out"
  log "Karpenter built in $((SECONDS - start)) s"
  echo "$out"
}

main() {
  mkdir -p "$CACHE"
  # one build at a time: `make test` starts one in the background while the unit tests run, and
  # the autoscaling e2e tests' own call waits here for it, then finds both cached
  exec 9>"$CACHE/.autoscalers.lock"
  flock 9
  build_cluster_autoscaler
  build_karpenter
}

main "$@"
