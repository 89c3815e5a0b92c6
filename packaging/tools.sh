#!/usr/bin/env bash
# The release's tools, built once from the Go module proxy at pinned versions and cached like the
# control plane's binaries (harness/controlplane/build.sh):
#   ${GPUSHARE_CACHE:-~/.cache/gpushare}/bin/<name>-<version>/<binary>
# The release workflow (.github/workflows/release.yml) and the dry run (make release-dryrun) build
# them with this one script, so both run the same versions.
#   bash packaging/tools.sh NAME...     prints one line per tool: the path of its binary
# Names: actionlint, oras, crane, krew, validate-krew-manifest, helm.
set -euo pipefail

ACTIONLINT_VERSION=v1.7.12      # github.com/rhysd/actionlint: the workflow's linter (make lint)
ORAS_VERSION=v1.3.6             # oras.land/oras: copies the image's OCI layout to the registry
CRANE_VERSION=v0.22.1           # github.com/google/go-containerregistry: digests; a local registry
KREW_VERSION=v0.4.3             # sigs.k8s.io/krew: installs the plugin from its manifest
# helm: the one harness/controlplane/build.sh pins (one helm version for tests and releases)
HELM_VERSION="$(sed -n 's/^HELM_VERSION=//p' "$(dirname "$0")/../harness/controlplane/build.sh")"

CACHE="${GPUSHARE_CACHE:-$HOME/.cache/gpushare}/bin"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf '[tools] %s\n' "$*" >&2; }

install_module() {  # name package version binary
  local out="$CACHE/$1-$3"
  if [ -x "$out/$4" ]; then echo "$out/$4"; return; fi
  log "building $1 $3 (once; cached in $out)"
  local start=$SECONDS tmp="$out.tmp.$$"
  mkdir -p "$tmp"
  GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "$2@$3" >&2
  rm -rf "$out" && mv "$tmp" "$out"
  log "$1 built in $((SECONDS - start)) s"
  echo "$out/$4"
}

tool() {
  case "$1" in
    actionlint) install_module actionlint github.com/rhysd/actionlint/cmd/actionlint "$ACTIONLINT_VERSION" actionlint ;;
    oras) install_module oras oras.land/oras/cmd/oras "$ORAS_VERSION" oras ;;
    crane) install_module crane github.com/google/go-containerregistry/cmd/crane "$CRANE_VERSION" crane ;;
    krew) install_module krew sigs.k8s.io/krew/cmd/krew "$KREW_VERSION" krew ;;
    validate-krew-manifest)
      install_module validate-krew-manifest sigs.k8s.io/krew/cmd/validate-krew-manifest "$KREW_VERSION" validate-krew-manifest ;;
    helm) install_module helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" helm ;;
    *) log "unknown tool $1: one of actionlint oras crane krew validate-krew-manifest helm"; exit 2 ;;
  esac
}

if [ $# -eq 0 ]; then set -- actionlint oras crane krew validate-krew-manifest helm; fi
mkdir -p "$CACHE"
for name in "$@"; do tool "$name"; done
