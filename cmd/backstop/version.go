package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=…"; otherwise
// the module version or VCS revision from the build info is shown.
var version = ""

func versionString() string {
	v := version
	info, ok := debug.ReadBuildInfo()
	if v == "" && ok {
		v = info.Main.Version
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 && (v == "" || v == "(devel)") {
				v = "dev-" + s.Value[:12]
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	return fmt.Sprintf("backstop %s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func (m *Main) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobraArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(m.Stdout, versionString())
			return err
		},
	}
}
