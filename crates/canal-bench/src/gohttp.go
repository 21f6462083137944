// B14's Go net/http cells (canal bench b14): a static Go program (CGO_ENABLED=0, so
// LD_PRELOAD cannot reach it; inside `canal run --isolate` seccomp user notification
// serves its sockets). Built by the bench with the system's Go; no modules, Go 1.19+.
//
//	gohttp server ADDR          serve /bulk?n=N (N bytes), /small (1 KiB), /quit
//	gohttp bulk URL SECONDS      download /bulk bodies back to back on one connection
//	gohttp req URL SECONDS CONNS 1 KiB GETs from CONNS keep-alive connections
//
// The server prints READY once it listens; a client prints one RESULT line.
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Each download's body (read whole: the overshoot past the duration is ~10 ms).
const bulkBody = 16 << 20

var chunk = func() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}()

func serve(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/bulk", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 0 {
			http.Error(w, "n: a byte count", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		for n > 0 {
			k := len(chunk)
			if n < k {
				k = n
			}
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1024")
		w.Write(chunk[:1024])
	})
	mux.HandleFunc("/quit", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("bye\n"))
		go func() {
			time.Sleep(50 * time.Millisecond)
			os.Exit(0)
		}()
	})
	fmt.Println("READY", ln.Addr())
	return http.Serve(ln, mux)
}

// idle fails a read that waits more than stallAfter for a byte: a path that stalls
// (pasta's loopback splice near the end of large downloads) is reported, not waited
// out.
type idle struct{ net.Conn }

const stallAfter = 3 * time.Second

func (c idle) Read(b []byte) (int, error) {
	c.Conn.SetReadDeadline(time.Now().Add(stallAfter))
	n, err := c.Conn.Read(b)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		err = fmt.Errorf("no byte for %v (stalled): %w", stallAfter, err)
	}
	return n, err
}

// same says whether b equals the pattern from body offset off (memcmp speed, so the
// check does not cap the throughput it measures).
func same(b []byte, off int) bool {
	for len(b) > 0 {
		p := off % len(chunk)
		k := len(chunk) - p
		if len(b) < k {
			k = len(b)
		}
		if !bytes.Equal(b[:k], chunk[p:p+k]) {
			return false
		}
		b, off = b[k:], off+k
	}
	return true
}

// get reads one body whole, checking its length and its bytes.
func get(c *http.Client, url string, want int, buf []byte) (int, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	got := 0
	for {
		n, err := resp.Body.Read(buf)
		if !same(buf[:n], got) {
			return got, fmt.Errorf("%s: bytes at %d differ", url, got)
		}
		got += n
		if err == io.EOF {
			break
		}
		if err != nil {
			return got, err
		}
	}
	if got != want {
		return got, fmt.Errorf("%s: %d bytes, not %d", url, got, want)
	}
	return got, nil
}

func client(mode, base string, secs float64, conns int) error {
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: conns,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			return idle{c}, err
		}}
	c := &http.Client{Transport: tr}
	// The server exits once asked; a client that cannot ask still ends.
	defer (&http.Client{Timeout: 3 * time.Second}).Get(base + "quit")
	start := time.Now()
	deadline := start.Add(time.Duration(secs * float64(time.Second)))
	if mode == "bulk" {
		buf := make([]byte, 256<<10)
		var total int64
		for time.Now().Before(deadline) {
			n, err := get(c, base+"bulk?n="+strconv.Itoa(bulkBody), bulkBody, buf)
			total += int64(n)
			if err != nil {
				return err
			}
		}
		el := time.Since(start).Seconds()
		fmt.Printf("RESULT gbit_s=%.4f bytes=%d seconds=%.3f\n", float64(total)*8/el/1e9, total, el)
		return nil
	}
	var done int64
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for time.Now().Before(deadline) {
				if _, err := get(c, base+"small", 1024, buf); err != nil {
					errs <- err
					return
				}
				atomic.AddInt64(&done, 1)
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	el := time.Since(start).Seconds()
	fmt.Printf("RESULT req_s=%.1f requests=%d seconds=%.3f\n", float64(done)/el, done, el)
	return nil
}

func main() {
	a := os.Args[1:]
	var err error
	switch {
	case len(a) == 2 && a[0] == "server":
		err = serve(a[1])
	case len(a) == 3 && a[0] == "bulk":
		var s float64
		if s, err = strconv.ParseFloat(a[2], 64); err == nil {
			err = client("bulk", a[1], s, 1)
		}
	case len(a) == 4 && a[0] == "req":
		var s float64
		var n int
		if s, err = strconv.ParseFloat(a[2], 64); err == nil {
			if n, err = strconv.Atoi(a[3]); err == nil {
				err = client("req", a[1], s, n)
			}
		}
	default:
		err = fmt.Errorf("usage: gohttp server ADDR | bulk URL SECONDS | req URL SECONDS CONNS")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gohttp:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
