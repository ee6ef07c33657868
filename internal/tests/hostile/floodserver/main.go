// Command floodserver is the API that the memory tests flood with unique
// idempotency keys while they read its resident memory from /proc.
//
// POST /orders, behind the idempotency middleware on a memstore bounded by
// -max-records and -max-bytes, answers 201 with a body of -body bytes, which
// the store keeps. GET /stats answers the store's records and bytes and the
// handler's executions, in JSON. The program prints "listening on ADDR" once
// it serves, and runs until it is killed.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	maxRecords := flag.Int("max-records", 0, "memstore's bound on records (0: its default)")
	maxBytes := flag.Int64("max-bytes", 0, "memstore's bound on bytes (0: its default)")
	size := flag.Int("body", 1024, "bytes in each response body")
	flag.Parse()

	var opts []memstore.Option
	if *maxRecords > 0 {
		opts = append(opts, memstore.WithMaxRecords(*maxRecords))
	}
	if *maxBytes > 0 {
		opts = append(opts, memstore.WithMaxBytes(*maxBytes))
	}
	store, err := memstore.New(opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	mw, err := server.New(store)
	if err != nil {
		log.Fatal(err)
	}
	body := bytes.Repeat([]byte("o"), *size)
	var executions atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		executions.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})))
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]int64{
			"records": int64(store.Len()), "bytes": store.Bytes(), "executions": executions.Load(),
		})
	})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listening on " + ln.Addr().String())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.Serve(ln))
}
