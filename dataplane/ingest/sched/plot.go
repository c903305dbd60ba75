package sched

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"time"
)

// Curve is one line of a plot: GPUs in use over time under one policy.
type Curve struct {
	Name   string
	Points []Point
}

// WriteSVG draws curves of GPUs in use over time as an SVG image, with the
// standard library only: a step line per curve, axes, ticks and a legend.
func WriteSVG(w io.Writer, title string, curves []Curve) error {
	const (
		width, height = 900, 480
		left, right   = 70, 170
		top, bottom   = 40, 50
	)
	var tmax time.Duration
	ymax := 1
	for _, c := range curves {
		for _, p := range c.Points {
			tmax = max(tmax, p.T)
			ymax = max(ymax, p.InUse)
		}
	}
	if tmax == 0 {
		tmax = time.Second
	}
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	x := func(t time.Duration) float64 { return float64(left) + pw*float64(t)/float64(tmax) }
	y := func(v int) float64 { return float64(top) + ph*(1-float64(v)/float64(ymax)) }
	colors := []string{"#888888", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(bw, `<text x="%d" y="24" font-size="15">%s</text>`+"\n", left, html.EscapeString(title))
	fmt.Fprintf(bw, `<path d="M%d %d V%d H%d" stroke="black" fill="none"/>`+"\n", left, top, height-bottom, width-right)
	for k := 0; k <= 5; k++ {
		v := ymax * k / 5
		fmt.Fprintf(bw, `<text x="%d" y="%.1f" text-anchor="end">%d</text>`+"\n", left-6, y(v)+4, v)
		t := tmax * time.Duration(k) / 5
		fmt.Fprintf(bw, `<text x="%.1f" y="%d" text-anchor="middle">%.1f h</text>`+"\n", x(t), height-bottom+18, t.Hours())
	}
	fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="middle">time</text>`+"\n", left+int(pw/2), height-10)
	fmt.Fprintf(bw, `<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">GPUs in use</text>`+"\n", top+int(ph/2), top+int(ph/2))
	for i, c := range curves {
		col := colors[i%len(colors)]
		if len(c.Points) > 0 {
			fmt.Fprintf(bw, `<path fill="none" stroke="%s" stroke-width="1.5" d="M%.1f %.1f`, col, x(c.Points[0].T), y(c.Points[0].InUse))
			prev := c.Points[0]
			for _, p := range c.Points[1:] {
				fmt.Fprintf(bw, " H%.1f V%.1f", x(p.T), y(p.InUse))
				prev = p
			}
			fmt.Fprintf(bw, " H%.1f\"/>\n", x(max(prev.T, tmax)))
		}
		ly := top + 10 + 20*i
		fmt.Fprintf(bw, `<path d="M%d %d h24" stroke="%s" stroke-width="3"/><text x="%d" y="%d">%s</text>`+"\n",
			width-right+14, ly, col, width-right+44, ly+4, html.EscapeString(c.Name))
	}
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}
