// Command local serves Berth's local back-end (processes on this host) as
// an out-of-tree driver plugin. Its instances are processes that outlive
// the plugin, so a plugin that crashes and restarts finds them again.
package main

import (
	"fmt"
	"os"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/plugin"
	_ "github.com/berth-dev/berth/drivers/local"
)

func main() {
	// Noise on stdout before the handshake: the host skips it.
	fmt.Println("local plugin starting")
	def, err := driver.Lookup("local")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	plugin.Serve(def, "1.0.0")
}
