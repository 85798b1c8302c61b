package backstop

import (
	_ "github.com/hashicorp/go-retryablehttp"
	_ "github.com/jmoiron/sqlx"
	_ "github.com/mattn/go-isatty"
	_ "github.com/spf13/cobra"
	_ "github.com/vbauerster/mpb/v8"
	_ "go.uber.org/goleak"
	_ "go.yaml.in/yaml/v3"
	_ "modernc.org/sqlite"
)
