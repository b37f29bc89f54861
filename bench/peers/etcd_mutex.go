// Peer: the etcd Go client's concurrency.Mutex (Debian's
// golang-etcd-server-dev, etcd 3.4's go.etcd.io/etcd/clientv3), with its
// defaults: a concurrency.Session (a lease of 60 s kept alive), Lock puts a
// key under the prefix with that lease and waits for the deletion of the key
// created just before it (a release is pushed by a watch); Unlock deletes the
// key. A worker of bench/peers/run.py: it speaks the protocol at the top of
// run.py (the same as peerlib.py's).
//
// Built by scripts/bench-peers.sh offline, from Debian's Go sources:
//
//	GO111MODULE=off GOPATH=DIR:/usr/share/gocode go build -o etcd-mutex etcd_mutex.go
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"golang.org/x/sys/unix"
)

// nowNs reads CLOCK_MONOTONIC: one clock for every process of the machine.
func nowNs() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		fail("clock_gettime: %v", err)
	}
	return ts.Nano()
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "etcd-mutex: "+format+"\n", args...)
	os.Exit(1)
}

type lock struct {
	mutex *concurrency.Mutex
}

// openLock connects to etcd://HOST:PORT and makes a Mutex on /bench-peers/KEY.
func openLock(uri, key string) *lock {
	u, err := url.Parse(uri)
	if err != nil || u.Host == "" {
		fail("bad uri %q", uri)
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(u.Host, ",")})
	if err != nil {
		fail("clientv3.New: %v", err)
	}
	session, err := concurrency.NewSession(client)
	if err != nil {
		fail("concurrency.NewSession: %v", err)
	}
	return &lock{concurrency.NewMutex(session, "/bench-peers/"+key)}
}

func (l *lock) acquire() error { return l.mutex.Lock(context.Background()) }
func (l *lock) release() error { return l.mutex.Unlock(context.Background()) }

func joinInts(word string, xs []int64) string {
	var b strings.Builder
	b.WriteString(word)
	for _, x := range xs {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(x, 10))
	}
	return b.String()
}

func uncontended(l *lock, n int) {
	warm := n / 10
	samples := make([]int64, 0, n)
	for i := 0; i < n+warm; i++ {
		start := nowNs()
		if err := l.acquire(); err != nil {
			fail("acquire: %v", err)
		}
		if err := l.release(); err != nil {
			fail("release: %v", err)
		}
		if i >= warm {
			samples = append(samples, nowNs()-start)
		}
	}
	fmt.Println(joinInts("samples", samples))
	fmt.Printf("done %d 0 0\n", len(samples))
}

func contend(l *lock, sharedPath string, seconds int64) {
	marker := sharedPath + ".held"
	f, err := os.OpenFile(sharedPath, os.O_RDWR, 0)
	if err != nil {
		fail("%v", err)
	}
	shared, err := syscall.Mmap(int(f.Fd()), 0, 16, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		fail("mmap %s: %v", sharedPath, err)
	}
	f.Close()
	fmt.Println("ready")
	for binary.LittleEndian.Uint64(shared[0:8]) == 0 {
		time.Sleep(time.Millisecond)
	}
	end := int64(binary.LittleEndian.Uint64(shared[0:8])) + seconds*1e9
	var count, errs, overlaps int64
	var waits []int64
	for nowNs() < end {
		asked := nowNs()
		if err := l.acquire(); err != nil {
			errs++
			fmt.Fprintf(os.Stderr, "acquire: %v\n", err)
			continue
		}
		waits = append(waits, nowNs()-asked)
		mine := false
		if m, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
			m.Close()
			mine = true
		} else if errors.Is(err, os.ErrExist) {
			overlaps++
		} else {
			fail("%v", err)
		}
		seen := binary.LittleEndian.Uint64(shared[8:16])
		binary.LittleEndian.PutUint64(shared[8:16], seen+1)
		count++
		if mine {
			os.Remove(marker)
		}
		if err := l.release(); err != nil {
			errs++
			fmt.Fprintf(os.Stderr, "release: %v\n", err)
		}
	}
	fmt.Println(joinInts("waits", waits))
	fmt.Printf("done %d %d %d\n", count, errs, overlaps)
}

func handoff(l *lock) {
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch strings.TrimSpace(in.Text()) {
		case "acquire":
			fmt.Println("waiting")
			if err := l.acquire(); err != nil {
				fail("acquire: %v", err)
			}
			fmt.Printf("acquired %d\n", nowNs())
		case "release":
			t := nowNs()
			if err := l.release(); err != nil {
				fail("release: %v", err)
			}
			fmt.Printf("released %d\n", t)
		case "quit":
			return
		}
	}
}

func main() {
	a := os.Args[1:]
	switch {
	case len(a) == 4 && a[0] == "uncontended":
		n, _ := strconv.Atoi(a[3])
		uncontended(openLock(a[1], a[2]), n)
	case len(a) == 5 && a[0] == "contend":
		s, _ := strconv.ParseInt(a[4], 10, 64)
		contend(openLock(a[1], a[2]), a[3], s)
	case len(a) == 3 && a[0] == "handoff":
		handoff(openLock(a[1], a[2]))
	default:
		fail("usage: etcd-mutex uncontended URI KEY N | contend URI KEY SHARED_FILE SECONDS | handoff URI KEY")
	}
}
