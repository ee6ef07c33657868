package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
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

func TestOrdersOTel(t *testing.T) {
	tests := []struct {
		name               string
		orders, lose, lost int
	}{
		{"every third response lost", 10, 3, 4},
		{"every second response lost", 4, 2, 3},
		{"nothing lost", 5, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			s, err := run(context.Background(), config{orders: tt.orders, lose: tt.lose, otel: true}, &out)
			require.NoError(t, err, out.String())
			assert.Equal(t, summary{submitted: tt.orders, created: tt.orders, lost: tt.lost, replayed: tt.lost}, s)

			text := out.String()
			const header = "OpenTelemetry metrics (stdout exporter):"
			i := strings.Index(text, header)
			require.GreaterOrEqual(t, i, 0, "no metrics in:\n%s", text)
			var e exported
			require.NoError(t, json.NewDecoder(strings.NewReader(text[i+len(header):])).Decode(&e))
			assert.Equal(t, []float64{float64(tt.orders)}, e.points("idempotency.server.requests", "idempotency.outcome", "executed"))
			replayed := e.points("idempotency.server.requests", "idempotency.outcome", "replayed")
			if tt.lost == 0 {
				assert.Empty(t, replayed)
			} else {
				assert.Equal(t, []float64{float64(tt.lost)}, replayed)
			}
			for _, name := range []string{"idempotency.client.attempts", "idempotency.server.store.duration", "idempotency.store.records"} {
				assert.Contains(t, text, `"Name": "`+name+`"`)
			}
		})
	}
}

func TestOrdersWithoutOTel(t *testing.T) {
	var out bytes.Buffer
	s, err := run(context.Background(), config{orders: 3, lose: 2}, &out)
	require.NoError(t, err, out.String())
	assert.Equal(t, 3, s.created)
	assert.Equal(t, "orders submitted 3, created 3; responses lost 2, replayed 2\n", out.String())
}

func TestOrdersRefusesBadFlags(t *testing.T) {
	for _, c := range []config{{orders: 0}, {orders: 1, lose: -1}} {
		_, err := run(context.Background(), c, io.Discard)
		assert.Error(t, err, "%+v", c)
	}
}
