// Command sim serves Berth's sim back-end as an out-of-tree driver plugin:
// the same driver, in its own process, reached through driver/plugin.
package main

import (
	"fmt"
	"os"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/driver/plugin"
	_ "github.com/berth-dev/berth/drivers/sim"
)

func main() {
	def, err := driver.Lookup("sim")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	plugin.Serve(def, "1.0.0")
}
