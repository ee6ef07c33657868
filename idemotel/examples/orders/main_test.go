package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/demo/ordersdemo"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// exported is what the stdout exporter writes, as far as the test reads it.
type exported struct {
	ScopeMetrics []struct {
		Metrics []struct {
			Name string
			Data struct {
				DataPoints []struct {
					Attributes []struct {
						Key   string
						Value struct{ Value any }
					}
					Value float64
				}
			}
		}
	}
}

// points returns the values of metric name's points whose attribute key is
// value.
func (e exported) points(name, key string, value any) []float64 {
	var out []float64
	for _, sm := range e.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, p := range m.Data.DataPoints {
				for _, a := range p.Attributes {
					if a.Key == key && a.Value.Value == value {
						out = append(out, p.Value)
					}
				}
			}
		}
	}
	return out
}

func TestDemoOTel(t *testing.T) {
	var out bytes.Buffer
	err := run(ordersdemo.Options{
		Orders: 40, Workers: 8, Store: "memory",
		Drop: 0.2, Reset: 0.05, Delay: 0.05, Hold: 500 * time.Millisecond,
		Timeout: 200 * time.Millisecond, Seed: 7,
	}, true, &out)
	require.NoError(t, err, out.String())
	text := out.String()
	assert.Contains(t, text, "first executions", "the demo's own tables")

	runs := map[string]exported{}
	for _, name := range []string{"naive retries", "idempotency keys"} {
		header := `OpenTelemetry metrics of the run "` + name + `" (stdout exporter):`
		i := strings.Index(text, header)
		require.GreaterOrEqual(t, i, 0, "no metrics for %s in:\n%s", name, text)
		var e exported
		require.NoError(t, json.NewDecoder(strings.NewReader(text[i+len(header):])).Decode(&e))
		runs[name] = e
	}
	naive, idem := runs["naive retries"], runs["idempotency keys"]
	assert.NotEmpty(t, naive.points("idempotency.server.requests", "idempotency.outcome", "unprotected"))
	assert.Empty(t, naive.points("idempotency.server.requests", "idempotency.outcome", "executed"), "each run has its own counts")
	assert.Equal(t, []float64{40}, idem.points("idempotency.server.requests", "idempotency.outcome", "executed"))
	// Each order ends with one operation that got its 201, first hand or
	// replayed.
	var succeeded float64
	for _, outcome := range []string{"completed", "replayed"} {
		for _, v := range idem.points("idempotency.client.operations", "idempotency.outcome", outcome) {
			succeeded += v
		}
	}
	assert.Equal(t, 40.0, succeeded, "operations that ended with the order")
	for _, name := range []string{"idempotency.client.attempts", "idempotency.server.store.duration", "idempotency.store.records"} {
		assert.Contains(t, text, `"Name": "`+name+`"`)
	}
}

func TestDemoWithoutOTel(t *testing.T) {
	var out bytes.Buffer
	err := run(ordersdemo.Options{
		Orders: 10, Workers: 4, Store: "memory", Hold: 100 * time.Millisecond, Timeout: 200 * time.Millisecond, Seed: 1,
	}, false, &out)
	require.NoError(t, err, out.String())
	assert.Contains(t, out.String(), "first executions")
	assert.NotContains(t, out.String(), "OpenTelemetry")
}
