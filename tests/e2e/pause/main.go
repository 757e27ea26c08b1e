// Command pause is the pod sandbox's process on the e2e real node: containerd starts it as the first
// process of every pod (the sandbox image is configured to an image holding only this binary, imported
// locally, since no registry is reachable). Like Kubernetes' own pause it sleeps until SIGTERM or
// SIGINT and reaps the zombies of a shared PID namespace. Standard library only, built static.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
