// Command kfake runs franz-go's in-process Kafka-protocol broker as a small standalone server, for
// the Kafka tests on machines without a Kafka broker. It lives in a module of its own so that kfake
// never enters outboxkit's dependency graph.
//
//	go run . -addr 127.0.0.1:9092
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9092", "listen address")
	partitions := flag.Int("partitions", 1, "partitions of an auto-created topic (real Kafka's default is 1)")
	flag.Parse()
	host, portStr, err := net.SplitHostPort(*addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfake: -addr:", err)
		os.Exit(2)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfake: -addr port:", err)
		os.Exit(2)
	}
	cluster, err := kfake.NewCluster(
		kfake.Ports(port),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(*partitions),
		kfake.GroupMinSessionTimeout(time.Second),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfake:", err)
		os.Exit(1)
	}
	fmt.Println("kfake listening on", cluster.ListenAddrs())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	cluster.Close()
}
