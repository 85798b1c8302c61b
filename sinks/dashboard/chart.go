package dashboard

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Chart geometry, in SVG user units (the SVG scales to its container).
const (
	chartWidth   = 1100
	chartHeight  = 220
	chartLeft    = 52
	chartRight   = 8
	chartTop     = 10
	chartBottom  = 24
	maxXLabels   = 8
	barGapFactor = 0.2
)

// series is one stacked layer of a bar chart: a value per period.
type series struct {
	Name   string
	Class  string
	Values []float64
}

// chart is a stacked bar chart laid out for the chart template: one bar
// per period, the series stacked in order.
type chart struct {
	Width, Height          int
	Left, Top, Right, Base float64
	Unit                   string
	Bars                   []bar
	YTicks, XTicks         []tick
	Legend                 []series
	// Empty reports that every value is zero.
	Empty bool
}

type bar struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

type tick struct {
	X, Y  float64
	Label string
}

// barChart lays out ss over periods (the starts of periods of length
// period), with a y axis from zero to a round number above the tallest
// stack.
func barChart(periods []time.Time, period time.Duration, unit string, ss []series) chart {
	c := chart{
		Width: chartWidth, Height: chartHeight, Unit: unit, Legend: ss,
		Left: chartLeft, Top: chartTop, Right: chartWidth - chartRight, Base: chartHeight - chartBottom,
	}
	n := len(periods)
	if n == 0 {
		c.Empty = true
		return c
	}
	tallest := 0.0
	for i := range n {
		sum := 0.0
		for _, s := range ss {
			sum += s.Values[i]
		}
		tallest = math.Max(tallest, sum)
	}
	c.Empty = tallest == 0
	// About five gridlines at a round step, at least 1 (counts are whole).
	step := math.Max(niceCeil(tallest/5), 1)
	lines := max(1, int(math.Ceil(tallest/step)))
	top := step * float64(lines)
	plotH := c.Base - c.Top
	slot := (c.Right - c.Left) / float64(n)
	gap := slot * barGapFactor
	for i, start := range periods {
		x := c.Left + float64(i)*slot + gap/2
		y := c.Base
		label := periodLabel(start, period)
		for _, s := range ss {
			v := s.Values[i]
			if v <= 0 {
				continue
			}
			h := v / top * plotH
			y -= h
			c.Bars = append(c.Bars, bar{X: round2(x), Y: round2(y), W: round2(slot - gap), H: round2(h), Class: s.Class,
				Title: fmt.Sprintf("%s: %s %s", label, formatValue(v), s.Name)})
		}
	}
	for i := 0; i <= lines; i++ {
		v := step * float64(i)
		c.YTicks = append(c.YTicks, tick{X: c.Left - 6, Y: round2(c.Base - v/top*plotH), Label: formatValue(v)})
	}
	every := max(1, (n+maxXLabels-1)/maxXLabels)
	for i := 0; i < n; i += every {
		c.XTicks = append(c.XTicks, tick{X: round2(c.Left + (float64(i)+0.5)*slot), Y: c.Base + 16, Label: axisLabel(periods[i], period)})
	}
	return c
}

// niceCeil returns the smallest of 1, 2, 2.5 and 5 times a power of ten
// that is at least v (1 for v <= 0).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// formatValue writes v briefly: 3, 2.5, 1.2k, 3M.
func formatValue(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e4:
		return strconv.FormatFloat(math.Round(v/100)/10, 'f', -1, 64) + "k"
	case v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

// axisLabel names a period's start under its bar.
func axisLabel(t time.Time, period time.Duration) string {
	if period >= 6*time.Hour {
		return t.UTC().Format("Jan 2 15h")
	}
	return t.UTC().Format("15:04")
}

// periodLabel names a period in a bar's tooltip.
func periodLabel(t time.Time, period time.Duration) string {
	return t.UTC().Format("Jan 2 15:04") + "–" + t.Add(period).UTC().Format("15:04") + " UTC"
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }
