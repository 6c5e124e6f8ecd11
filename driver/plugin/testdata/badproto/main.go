// Command badproto is a go-plugin plugin with Berth's cookie that speaks
// plugin protocol 2, for the test that such a plugin is refused.
package main

import (
	"context"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berth-dev/berth/driver/plugin"
)

type empty struct {
	goplugin.NetRPCUnsupportedPlugin
}

func (empty) GRPCServer(*goplugin.GRPCBroker, *grpc.Server) error { return nil }
func (empty) GRPCClient(context.Context, *goplugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, nil
}

func main() {
	hs := plugin.Handshake
	hs.ProtocolVersion = 2
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig:  hs,
		VersionedPlugins: map[int]goplugin.PluginSet{2: {"driver": empty{}}},
		GRPCServer:       goplugin.DefaultGRPCServer,
	})
}
