package mysqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idempotency/internal/testkit/servicetest"
)

// startMariaDB starts a MariaDB server of the test's own, on an empty data
// directory and a free loopback port, with args (server options such as
// --max-allowed-packet), and returns a database handle on its database
// test; the server is killed, and the handle closed, when t ends. It skips
// t where mariadbd is not installed, or fails it when services are
// required.
func startMariaDB(t *testing.T, args ...string) *sql.DB {
	t.Helper()
	bin, err := exec.LookPath("mariadbd")
	if err != nil {
		bin, err = exec.LookPath("/usr/sbin/mariadbd") // not on every user's PATH
	}
	if err != nil {
		msg := fmt.Sprintf("this test starts a MariaDB server of its own and needs mariadbd: %v; "+
			"install MariaDB (e.g. apt-get install mariadb-server) to run it", err)
		if servicetest.Required() {
			t.Fatalf("%s (%s is set, so this is a failure)", msg, servicetest.EnvRequireServices)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	full := append([]string{"--no-defaults", "--datadir=" + dir, "--socket=" + dir + "/mysqld.sock",
		"--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1", "--skip-grant-tables", "--skip-log-bin",
		"--user=root", "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=48M"}, args...)
	cmd := exec.Command(bin, full...)
	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	cmd.Stdout = writerFunc(func(b []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(b) })
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting mariadbd: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User = "tcp", "127.0.0.1:"+strconv.Itoa(port), "root"
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	root := sql.OpenDB(connector)
	defer root.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = root.PingContext(ctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-exited:
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("mariadbd exited: %s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("mariadbd on port %d does not answer: %v", port, err)
		}
	}
	if _, err := root.Exec("CREATE DATABASE test"); err != nil {
		t.Fatal(err)
	}
	cfg.DBName = "test"
	if connector, err = mysql.NewConnector(cfg); err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { db.Close() })
	return db
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
