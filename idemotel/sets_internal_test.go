package idemotel

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/otel/attribute"
)

// TestSetCacheBounded: a cache keeps at most maxCachedSets sets, and gives
// the right attributes past that too.
func TestSetCacheBounded(t *testing.T) {
	var c setCache[string]
	for i := range maxCachedSets + 100 {
		method := "M" + strconv.Itoa(i)
		build := func() []attribute.KeyValue { return []attribute.KeyValue{methodKey.String(method)} }
		first, again := c.get(method, build), c.get(method, build)
		assert.Equal(t, first, again)
	}
	assert.Equal(t, int64(maxCachedSets), c.n.Load())
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	assert.Equal(t, maxCachedSets, n)
}
