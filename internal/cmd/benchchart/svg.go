package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// The charts are SVG written by hand: text, so that a change shows in a
// diff, and the same report always gives the same bytes (no map order, no
// time, numbers printed to a fixed precision).

const (
	width   = 720
	height  = 400
	left    = 72.0  // room for the y axis labels
	right   = 200.0 // room for the legend
	top     = 48.0
	bottom  = 56.0
	plotW   = width - left - right
	plotH   = height - top - bottom
	fontCSS = "font-family:Helvetica,Arial,sans-serif"
)

// palette gives each store a colour of its own, the same in every chart.
var palette = map[string]string{
	"bare":     "#555555",
	"memory":   "#1b9e77",
	"postgres": "#7570b3",
	"redis":    "#d95f02",
}

// extra colours, for items that are not stores.
var extra = []string{"#1f78b4", "#e7298a", "#66a61e", "#e6ab02", "#a6761d"}

func colorOf(name string, i int) string {
	if c, ok := palette[name]; ok {
		return c
	}
	return extra[i%len(extra)]
}

// num prints a coordinate.
func num(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }

// svg collects an image.
type svg struct{ b strings.Builder }

func (s *svg) printf(format string, args ...any) { fmt.Fprintf(&s.b, format, args...) }

func (s *svg) begin(title string) {
	s.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" style="%s;font-size:12px">`+"\n",
		width, height, width, height, fontCSS)
	s.printf(`<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	s.text(width/2, 24, "middle", "font-size:15px;font-weight:bold", title)
}

func (s *svg) end(w io.Writer) error {
	s.printf("</svg>\n")
	_, err := io.WriteString(w, s.b.String())
	return err
}

func (s *svg) text(x, y float64, anchor, style, t string) {
	if style != "" {
		style = ` style="` + style + `"`
	}
	s.printf(`<text x="%s" y="%s" text-anchor="%s"%s>%s</text>`+"\n", num(x), num(y), anchor, style, html.EscapeString(t))
}

func (s *svg) line(x1, y1, x2, y2 float64, stroke string, dash string) {
	if dash != "" {
		dash = ` stroke-dasharray="` + dash + `"`
	}
	s.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"%s/>`+"\n", num(x1), num(y1), num(x2), num(y2), stroke, dash)
}

func (s *svg) rect(x, y, w, h float64, fill string) {
	s.printf(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", num(x), num(y), num(w), num(h), fill)
}

// scale maps values to the plot's height, linearly from zero or
// logarithmically.
type scale struct {
	lo, hi float64
	log    bool
}

// newScale returns a scale whose range holds every value in vs, with round
// ends.
func newScale(vs []float64, log bool) scale {
	hi := 0.0
	lo := math.Inf(1)
	for _, v := range vs {
		hi = max(hi, v)
		if v > 0 {
			lo = min(lo, v)
		}
	}
	if log {
		if math.IsInf(lo, 1) {
			lo, hi = 1, 10
		}
		return scale{lo: math.Pow(10, math.Floor(math.Log10(lo))), hi: math.Pow(10, math.Ceil(math.Log10(hi*1.0001))), log: true}
	}
	neg := 0.0
	for _, v := range vs {
		neg = min(neg, v)
	}
	if hi-neg <= 0 {
		hi = 1
	}
	step := niceStep((hi - neg) / 5)
	return scale{lo: math.Floor(neg/step) * step, hi: math.Ceil(hi*1.0001/step) * step}
}

// niceStep returns 1, 2 or 5 times a power of ten, at least x.
func niceStep(x float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

// y returns the vertical position of v.
func (sc scale) y(v float64) float64 {
	var f float64
	if sc.log {
		v = max(v, sc.lo)
		f = (math.Log10(v) - math.Log10(sc.lo)) / (math.Log10(sc.hi) - math.Log10(sc.lo))
	} else {
		f = (v - sc.lo) / (sc.hi - sc.lo)
	}
	return top + plotH*(1-f)
}

// ticks returns the values to label.
func (sc scale) ticks() []float64 {
	var t []float64
	if sc.log {
		// 1, 2 and 5 of each power of ten when there are few of them.
		steps := []float64{1, 2, 5}
		if sc.hi/sc.lo > 1e4 {
			steps = []float64{1}
		}
		for p := sc.lo; p <= sc.hi*1.0001; p *= 10 {
			for _, m := range steps {
				if v := p * m; v <= sc.hi*1.0001 {
					t = append(t, v)
				}
			}
		}
		return t
	}
	step := niceStep((sc.hi - sc.lo) / 5)
	for v := sc.lo; v <= sc.hi*1.0001+step/1e6; v += step {
		t = append(t, v)
	}
	return t
}

// label prints a tick's value briefly: 1200 as 1.2k, 3000000 as 3M.
func label(v float64) string {
	switch {
	case v >= 1e6:
		return trim(strconv.FormatFloat(v/1e6, 'f', 1, 64)) + "M"
	case v >= 1e3:
		return trim(strconv.FormatFloat(v/1e3, 'f', 1, 64)) + "k"
	case v >= 10 || v == 0:
		return strconv.FormatFloat(v, 'f', 0, 64)
	default:
		return trim(strconv.FormatFloat(v, 'f', 2, 64))
	}
}

func trim(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// axes draws the y axis with its grid, and the x axis's category labels.
func (s *svg) axes(sc scale, yLabel, xLabel string, categories []string) {
	for _, v := range sc.ticks() {
		y := sc.y(v)
		s.line(left, y, left+plotW, y, "#e0e0e0", "")
		s.text(left-6, y+4, "end", "", label(v))
	}
	s.line(left, top, left, top+plotH, "#333333", "")
	s.line(left, top+plotH, left+plotW, top+plotH, "#333333", "")
	for i, c := range categories {
		s.text(catX(i, len(categories)), top+plotH+18, "middle", "", c)
	}
	s.text(left+plotW/2, height-14, "middle", "", xLabel)
	s.printf(`<text x="16" y="%s" text-anchor="middle" transform="rotate(-90 16 %s)">%s</text>`+"\n",
		num(top+plotH/2), num(top+plotH/2), html.EscapeString(yLabel))
}

// catX returns the middle of category i of n.
func catX(i, n int) float64 { return left + plotW*(float64(i)+0.5)/float64(n) }

// series is a line of a line chart: a value for each category, NaN where
// there is none.
type series struct {
	name   string
	color  string
	dashed bool
	values []float64
}

// lineChart draws series over categories.
func lineChart(w io.Writer, title, yLabel, xLabel string, categories []string, ss []series, log bool) error {
	var all []float64
	for _, sr := range ss {
		for _, v := range sr.values {
			if !math.IsNaN(v) {
				all = append(all, v)
			}
		}
	}
	sc := newScale(all, log)
	var s svg
	s.begin(title)
	s.axes(sc, yLabel, xLabel, categories)
	for i, sr := range ss {
		dash := ""
		if sr.dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		flush := func() {
			if len(pts) > 1 {
				s.printf(`<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", sr.color, dash, strings.Join(pts, " "))
			}
			pts = pts[:0]
		}
		for j, v := range sr.values {
			if math.IsNaN(v) {
				flush()
				continue
			}
			x, y := catX(j, len(categories)), sc.y(v)
			pts = append(pts, num(x)+","+num(y))
			s.printf(`<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", num(x), num(y), sr.color)
		}
		flush()
		ly := top + 8 + float64(i)*18
		s.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>`+"\n",
			num(left+plotW+16), num(ly), num(left+plotW+40), num(ly), sr.color, dash)
		s.text(left+plotW+46, ly+4, "start", "", sr.name)
	}
	return s.end(w)
}

// bar is one bar of a bar chart, made of stacked parts.
type bar struct {
	label string
	parts []float64
}

// barChart draws groups of bars, each bar a stack of parts named by
// partNames.
func barChart(w io.Writer, title, yLabel string, groups []string, bars [][]bar, partNames []string, colors []string, log bool) error {
	var all []float64
	for _, g := range bars {
		for _, b := range g {
			sum := 0.0
			for _, p := range b.parts {
				if !math.IsNaN(p) {
					sum += p
				}
			}
			all = append(all, sum)
		}
	}
	sc := newScale(all, log)
	var s svg
	s.begin(title)
	s.axes(sc, yLabel, "", groups)
	for gi, g := range bars {
		slot := plotW / float64(len(bars))
		bw := min(40, slot*0.8/float64(max(1, len(g))))
		x0 := catX(gi, len(bars)) - bw*float64(len(g))/2
		for bi, b := range g {
			x := x0 + float64(bi)*bw
			base := 0.0
			for pi, p := range b.parts {
				if math.IsNaN(p) || p <= 0 {
					continue
				}
				y0, y1 := sc.y(base), sc.y(base+p)
				if sc.log && base == 0 {
					y0 = top + plotH
				}
				s.rect(x+1, y1, bw-2, y0-y1, colors[pi%len(colors)])
				base += p
			}
			if b.label != "" {
				s.text(x+bw/2, sc.y(base)-4, "middle", "font-size:10px", b.label)
			}
		}
	}
	for i, name := range partNames {
		ly := top + 8 + float64(i)*18
		s.rect(left+plotW+16, ly-6, 24, 12, colors[i%len(colors)])
		s.text(left+plotW+46, ly+4, "start", "", name)
	}
	return s.end(w)
}
