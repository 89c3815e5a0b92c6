//go:build tools

// Package tools pins the Karpenter command that build.sh compiles: its kwok cloud provider.
package tools

import _ "sigs.k8s.io/karpenter/kwok"
