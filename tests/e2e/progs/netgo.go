// A network client/server tests/e2e/test_isolate.py builds with CGO_ENABLED=0 (a static Go
// binary: the Go runtime makes its socket system calls itself, past any LD_PRELOAD).

package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
)

func main() {
	switch os.Args[1] {
	case "dial":
		c, err := net.Dial("tcp", os.Args[2])
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Printf("got %s local %s remote %s\n", line[:len(line)-1], c.LocalAddr(), c.RemoteAddr())
	case "serve", "serve6":
		// serve6: an IPv6-only listener on ::1 ("tcp6": Go sets IPV6_V6ONLY).
		network, addr := "tcp", ":"+os.Args[2]
		if os.Args[1] == "serve6" {
			network, addr = "tcp6", "[::1]:"+os.Args[2]
		}
		l, err := net.Listen(network, addr)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("listening", l.Addr())
		n, _ := strconv.Atoi(os.Args[3])
		for i := 0; i < n; i++ {
			c, err := l.Accept()
			if err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			fmt.Fprintf(c, "go %s\n", c.RemoteAddr())
			c.Close()
		}
	case "resolve":
		addrs, err := net.LookupHost(os.Args[2])
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("resolved", addrs)
	}
}
