// Command etcd is upstream etcd's server, built from its published Go module. The server module
// replaces its siblings with local paths, so it cannot be installed directly; this module
// requires the published versions instead.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
