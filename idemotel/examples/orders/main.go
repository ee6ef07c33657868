// Command orders is the demo of examples/orders, with OpenTelemetry: the
// same two runs, naive retries and then idempotency keys, through the same
// lossy network, and the same tables. With -otel it also writes, after them,
// each run's metrics as OpenTelemetry metrics to stdout, through the SDK's
// stdout exporter: the middleware's (package idemotel's ServerObserver), the
// client's (ClientObserver) and, with the memory store, the store's gauges
// (RegisterStoreSize). Each run's metrics are its own (delta temporality for the counters and histograms).
//
//	cd idemotel && go run ./examples/orders -otel
//
// It takes every flag of examples/orders; see -h.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idempotency/idemotel"
	"github.com/idemkit/idempotency/internal/demo/ordersdemo"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/memstore"
)

func main() {
	var o ordersdemo.Options
	o.Flags(flag.CommandLine)
	withOTel := flag.Bool("otel", false, "write each run's metrics to stdout as OpenTelemetry metrics (stdout exporter)")
	flag.Parse()
	if err := run(o, *withOTel, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

// temporality makes the counters and histograms report each run's own
// measurements, and the up-down counters and gauges their values.
func temporality(kind sdkmetric.InstrumentKind) metricdata.Temporality {
	switch kind {
	case sdkmetric.InstrumentKindCounter, sdkmetric.InstrumentKindHistogram, sdkmetric.InstrumentKindObservableCounter:
		return metricdata.DeltaTemporality
	}
	return metricdata.CumulativeTemporality
}

// run runs the demo, and with withOTel writes its metrics to out after the
// tables.
func run(o ordersdemo.Options, withOTel bool, out io.Writer) error {
	if !withOTel {
		_, err := ordersdemo.Run(o, out)
		return err
	}
	ctx := context.Background()
	var buf bytes.Buffer
	exp, err := stdoutmetric.New(
		stdoutmetric.WithWriter(&buf),
		stdoutmetric.WithPrettyPrint(),
		stdoutmetric.WithTemporalitySelector(temporality),
	)
	if err != nil {
		return err
	}
	// Exported when flushed after each run, not on a timer.
	reader := sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(24*time.Hour))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	o.Observer, err = idemotel.ServerObserver(idemotel.WithMeterProvider(mp))
	if err != nil {
		return err
	}
	o.ClientObserver, err = idemotel.ClientObserver(idemotel.WithMeterProvider(mp))
	if err != nil {
		return err
	}
	o.OnStore = func(s server.Store) error {
		if mem, ok := s.(*memstore.Store); ok {
			_, err := idemotel.RegisterStoreSize(idemotel.SizeOf(mem), idemotel.WithMeterProvider(mp))
			return err
		}
		return nil
	}
	type export struct{ name, json string }
	var exports []export
	o.AfterRun = func(name string) error {
		err := mp.ForceFlush(ctx)
		exports = append(exports, export{name, buf.String()})
		buf.Reset()
		return err
	}
	_, runErr := ordersdemo.Run(o, out)
	for _, e := range exports {
		fmt.Fprintf(out, "\nOpenTelemetry metrics of the run %q (stdout exporter):\n%s", e.name, e.json)
	}
	return runErr
}
