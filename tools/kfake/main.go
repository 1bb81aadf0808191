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
	addr := flag.String("addr", "127.0.0.1:9092", "the broker's address, as clients are told in metadata; also where it listens unless -listen")
	listen := flag.String("listen", "", "listen here instead (host:port), e.g. behind a proxy that clients reach at -addr")
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
	listenAddr := net.JoinHostPort(host, strconv.Itoa(port))
	if *listen != "" {
		listenAddr = *listen
	}
	cluster, err := kfake.NewCluster(
		kfake.Ports(port),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			ln, err := net.Listen(network, listenAddr)
			if err != nil || *listen == "" {
				return ln, err
			}
			adv, err := net.ResolveTCPAddr("tcp", *addr)
			if err != nil {
				_ = ln.Close()
				return nil, err
			}
			// kfake tells clients the listener's own address; behind a proxy they must be told -addr.
			return advertised{Listener: ln, addr: adv}, nil
		}),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(*partitions),
		kfake.GroupMinSessionTimeout(time.Second),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfake:", err)
		os.Exit(1)
	}
	fmt.Println("kfake listening on", listenAddr, "as", cluster.ListenAddrs())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	cluster.Close()
}

// advertised is a listener that reports another address: the one clients are told to dial.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }
