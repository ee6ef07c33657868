package idemotel

import (
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// maxCachedSets bounds a setCache: the attributes of the measurements take
// few values (kinds, status codes, methods), but a method is the caller's
// to choose.
const maxCachedSets = 4096

// setCache keeps the attribute sets of measurements, which would otherwise
// be built, sorted and allocated for each one.
type setCache[K comparable] struct {
	m sync.Map // K → metric.MeasurementOption
	n atomic.Int64
}

// get returns the measurement option for k, whose attributes build makes.
func (c *setCache[K]) get(k K, build func() []attribute.KeyValue) metric.MeasurementOption {
	if v, ok := c.m.Load(k); ok {
		return v.(metric.MeasurementOption)
	}
	opt := metric.WithAttributeSet(attribute.NewSet(build()...))
	if c.n.Load() < maxCachedSets {
		if _, loaded := c.m.LoadOrStore(k, opt); !loaded {
			c.n.Add(1)
		}
	}
	return opt
}
