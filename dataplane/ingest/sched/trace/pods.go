package trace

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// PodColumns are the columns of openb_pod_list_*.csv, in the trace's order.
var PodColumns = []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec",
	"qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"}

// Pod is one row of an openb pod list. Times are seconds since the trace's
// start; a missing deletion or scheduling time is -1.
type Pod struct {
	Name      string
	CPUMilli  int
	MemoryMiB int
	NumGPU    int
	GPUMilli  int // share of each GPU, in thousandths
	GPUSpec   string
	QoS       string
	Phase     string
	Creation  int64
	Deletion  int64
	Scheduled int64
	Line      int // line in the file, for messages
}

// ErrMalformed is wrapped by every error about a bad row or header.
var ErrMalformed = errors.New("malformed trace")

// LoadPods reads a pod list file.
func LoadPods(path string) ([]Pod, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pod trace: %w", err)
	}
	defer f.Close()
	pods, err := ReadPods(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return pods, nil
}

// table reads a CSV with a header naming at least want, calling row for each
// record with a lookup by column name.
func table(r io.Reader, want []string, row func(line int, get func(string) string) error) error {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	head, err := cr.Read()
	if err != nil {
		return fmt.Errorf("line %d: header: %w", readLine(err, 1), readErr(err))
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, w := range want {
		if _, ok := col[w]; !ok {
			return fmt.Errorf("line 1: header lacks column %q (want %s): %w", w, strings.Join(want, ","), ErrMalformed)
		}
	}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			// FieldPos is only defined after a successful read: a row that
			// fails in its first field has none.
			return fmt.Errorf("line %d: %w", readLine(err, 0), readErr(err))
		}
		line, _ := cr.FieldPos(0)
		if len(rec) != len(head) {
			return fmt.Errorf("line %d: %d fields, header has %d: %w", line, len(rec), len(head), ErrMalformed)
		}
		get := func(name string) string { return strings.TrimSpace(rec[col[name]]) }
		if err := row(line, get); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
	}
}

// readLine returns the line on which the record a csv.Reader failed on
// starts, from its *csv.ParseError (def if err is not one).
func readLine(err error, def int) int {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return pe.StartLine
	}
	return def
}

// readErr wraps a failed read: a parse error is a malformed trace, another
// error (the file's) is not.
func readErr(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return fmt.Errorf("read: %w", err)
}

func intField(get func(string) string, name string, optional bool) (int64, error) {
	s := get(name)
	if s == "" && optional {
		return -1, nil
	}
	// Some exports write integers as floats ("1.0").
	if f, err := strconv.ParseFloat(s, 64); err == nil && f == float64(int64(f)) && f >= 0 {
		return int64(f), nil
	}
	return 0, fmt.Errorf("column %s: %q is not a non-negative integer: %w", name, s, ErrMalformed)
}

// ReadPods reads a pod list; errors name the line and column.
func ReadPods(r io.Reader) ([]Pod, error) {
	var pods []Pod
	err := table(r, PodColumns, func(line int, get func(string) string) error {
		p := Pod{Name: get("name"), GPUSpec: get("gpu_spec"), QoS: get("qos"), Phase: get("pod_phase"), Line: line}
		ints := []struct {
			name     string
			optional bool
			dst      *int64
		}{
			{"creation_time", false, &p.Creation},
			{"deletion_time", true, &p.Deletion},
			{"scheduled_time", true, &p.Scheduled},
		}
		for _, f := range ints {
			v, err := intField(get, f.name, f.optional)
			if err != nil {
				return err
			}
			*f.dst = v
		}
		for _, f := range []struct {
			name string
			dst  *int
		}{{"cpu_milli", &p.CPUMilli}, {"memory_mib", &p.MemoryMiB}, {"num_gpu", &p.NumGPU}, {"gpu_milli", &p.GPUMilli}} {
			v, err := intField(get, f.name, false)
			if err != nil {
				return err
			}
			*f.dst = int(v)
		}
		switch {
		case p.Name == "":
			return fmt.Errorf("column name: empty: %w", ErrMalformed)
		case p.GPUMilli > 1000:
			return fmt.Errorf("column gpu_milli: %d above 1000 (one whole GPU): %w", p.GPUMilli, ErrMalformed)
		case p.NumGPU > 1 && p.GPUMilli != 1000:
			return fmt.Errorf("num_gpu %d with gpu_milli %d: a share below 1000 is only defined for one GPU: %w", p.NumGPU, p.GPUMilli, ErrMalformed)
		case p.NumGPU > 0 && p.GPUMilli == 0:
			return fmt.Errorf("num_gpu %d with gpu_milli 0: %w", p.NumGPU, ErrMalformed)
		case p.Deletion >= 0 && p.Deletion < p.Creation:
			return fmt.Errorf("deletion_time %d before creation_time %d: %w", p.Deletion, p.Creation, ErrMalformed)
		case p.Scheduled >= 0 && p.Scheduled < p.Creation:
			return fmt.Errorf("scheduled_time %d before creation_time %d: %w", p.Scheduled, p.Creation, ErrMalformed)
		case max(p.Creation, p.Deletion, p.Scheduled) > MaxSeconds:
			// Times become nanoseconds (time.Duration) when mapped.
			return fmt.Errorf("times past %d s (292 years), the latest a trace can hold: are they in seconds since the trace's start? %w", MaxSeconds, ErrMalformed)
		}
		pods = append(pods, p)
		return nil
	})
	return pods, err
}

// WritePods writes pods as an openb pod list.
func WritePods(w io.Writer, pods []Pod) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(PodColumns); err != nil {
		return fmt.Errorf("pod trace: %w", err)
	}
	opt := func(v int64) string {
		if v < 0 {
			return ""
		}
		return strconv.FormatInt(v, 10)
	}
	for _, p := range pods {
		rec := []string{p.Name, strconv.Itoa(p.CPUMilli), strconv.Itoa(p.MemoryMiB), strconv.Itoa(p.NumGPU),
			strconv.Itoa(p.GPUMilli), p.GPUSpec, p.QoS, p.Phase, strconv.FormatInt(p.Creation, 10),
			opt(p.Deletion), opt(p.Scheduled)}
		if err := cw.Write(rec); err != nil {
			return fmt.Errorf("pod trace: %w", err)
		}
	}
	cw.Flush()
	return cw.Error()
}
