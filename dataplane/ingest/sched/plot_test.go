package sched

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"
)

func TestWriteSVGIsWellFormed(t *testing.T) {
	var buf bytes.Buffer
	curves := []Curve{
		{Name: "naive", Points: []Point{{0, 1}, {time.Hour, 3}, {2 * time.Hour, 0}}},
		{Name: "lovelock <&>", Points: []Point{{0, 1}, {time.Hour, 2}}},
	}
	if err := WriteSVG(&buf, "GPUs in use", curves); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(strings.NewReader(buf.String()))
	paths := 0
	for {
		tok, err := d.Token()
		if err != nil {
			if err == io.EOF {
				break
			}
			t.Fatalf("not well-formed XML: %v\n%s", err, buf.String())
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "path" {
			paths++
		}
	}
	// Axes, two curves, two legend marks.
	if paths != 5 {
		t.Fatalf("%d paths, want 5", paths)
	}
}
