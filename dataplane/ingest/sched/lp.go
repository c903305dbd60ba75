package sched

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// WriteLP writes the instance as a time-indexed MILP in CPLEX LP format, for
// an external solver (CBC, GLPK) to check Solve against. x_i_g_s_t = 1 when
// job i runs on GPU g from start slot s (the slot number) at time t; y_g = 1
// when GPU g is used. Each job runs once (eq. 1a); in every time unit every
// memory slice of every GPU holds at most one job, which replaces the paper's
// capacity sum (1c, 1d) by the real geometry; y_g ≥ each x on g (1e); a job
// finishing after its deadline costs its memory slices (1f). Running work
// (Instance.Busy) removes the variables that would overlap it, and open GPUs
// cost nothing.
func WriteLP(w io.Writer, in *Instance) error {
	if err := in.check(); err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	h := in.horizon()
	type v struct{ i, g, s, t int }
	var vars []v
	name := func(x v) string { return fmt.Sprintf("x_%d_%d_%d_%d", x.i, x.g, x.s, x.t) }
	for i, j := range in.Jobs {
		p := in.Card.Profiles[j.Profile]
		for g := 0; g < in.GPUs; g++ {
			for _, s := range p.Starts {
				for t := j.Release; t+j.Duration <= h; t++ {
					if in.busyAt(g, p.Mask(s), t) {
						continue // running work holds a slice
					}
					vars = append(vars, v{i, g, s, t})
				}
			}
		}
	}
	var obj []string
	for g := in.Open; g < in.GPUs; g++ { // open GPUs are paid for
		obj = append(obj, fmt.Sprintf("%d y_%d", in.Weights.GPU, g))
	}
	for _, x := range vars {
		j := in.Jobs[x.i]
		if x.t+j.Duration > j.Deadline {
			obj = append(obj, fmt.Sprintf("%d %s", in.Weights.MissPerSlice*in.Card.Profiles[j.Profile].MemSlices, name(x)))
		}
	}
	fmt.Fprintln(bw, "\\ eq. 1 of Conspirator with MIG memory-slot geometry (Lovelock sched.WriteLP)")
	fmt.Fprintln(bw, "Minimize")
	writeSum(bw, " obj: ", obj)
	fmt.Fprintln(bw, "\nSubject To")
	perJob := make([][]string, len(in.Jobs))
	perGPU := make([][]string, in.GPUs)
	cell := map[[3]int][]string{} // (g, slice, time) → vars
	for _, x := range vars {
		n := name(x)
		perJob[x.i] = append(perJob[x.i], n)
		perGPU[x.g] = append(perGPU[x.g], n)
		p := in.Card.Profiles[in.Jobs[x.i].Profile]
		for m := x.s; m < x.s+p.MemSlices; m++ {
			for t := x.t; t < x.t+in.Jobs[x.i].Duration; t++ {
				k := [3]int{x.g, m, t}
				cell[k] = append(cell[k], n)
			}
		}
	}
	for i, terms := range perJob {
		writeSum(bw, fmt.Sprintf(" once_%d: ", i), terms)
		fmt.Fprintln(bw, " = 1")
	}
	for g, terms := range perGPU {
		if len(terms) == 0 {
			continue
		}
		writeSum(bw, fmt.Sprintf(" used_%d: ", g), terms)
		fmt.Fprintf(bw, " - %d y_%d <= 0\n", len(in.Jobs), g)
	}
	for g := 0; g < in.GPUs; g++ {
		for m := 0; m < 8; m++ {
			for t := 0; t < h; t++ {
				if terms := cell[[3]int{g, m, t}]; len(terms) > 1 {
					writeSum(bw, fmt.Sprintf(" slice_%d_%d_%d: ", g, m, t), terms)
					fmt.Fprintln(bw, " <= 1")
				}
			}
		}
	}
	fmt.Fprintln(bw, "Binaries")
	for _, x := range vars {
		fmt.Fprintln(bw, " "+name(x))
	}
	for g := 0; g < in.GPUs; g++ {
		fmt.Fprintf(bw, " y_%d\n", g)
	}
	fmt.Fprintln(bw, "End")
	return bw.Flush()
}

// busyAt reports whether fixed occupancy holds a slice of mask m on GPU g at
// time t (it starts at 0, so a job starting at t meets it only if t < Until).
func (in *Instance) busyAt(g int, m uint8, t int) bool {
	for _, b := range in.Busy {
		if b.GPU == g && b.Mask&m != 0 && t < b.Until {
			return true
		}
	}
	return false
}

// writeSum writes terms joined by " + ", wrapping long lines (LP readers
// limit line length).
func writeSum(w io.Writer, head string, terms []string) {
	io.WriteString(w, head)
	for k, t := range terms {
		if k > 0 {
			io.WriteString(w, " + ")
		}
		if k > 0 && k%8 == 0 {
			io.WriteString(w, "\n   ")
		}
		io.WriteString(w, t)
	}
	if len(terms) == 0 {
		io.WriteString(w, "0 y_0")
	}
}

// ParseCBCSolution reads the objective from a CBC solution file (written by
// "cbc model.lp solve solution FILE"), whose first line reads e.g.
// "Optimal - objective value 16.00000000".
func ParseCBCSolution(r io.Reader) (int, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && line == "" {
		return 0, fmt.Errorf("cbc solution: %w", err)
	}
	if !strings.HasPrefix(line, "Optimal") {
		return 0, fmt.Errorf("cbc solution: not optimal: %q", strings.TrimSpace(line))
	}
	f := strings.Fields(line)
	v, err := strconv.ParseFloat(f[len(f)-1], 64)
	if err != nil {
		return 0, fmt.Errorf("cbc solution: objective in %q: %w", strings.TrimSpace(line), err)
	}
	return int(v + 0.5), nil
}
