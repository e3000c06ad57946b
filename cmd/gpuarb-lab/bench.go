package main

import "github.com/urfave/cli/v2"

func benchCommand() *cli.Command {
	return &cli.Command{Name: "bench", Usage: "measure gpuarb beside the unarbitrated baseline and write BENCHMARKS.md"}
}
