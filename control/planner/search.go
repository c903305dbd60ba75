package planner

import (
	"errors"
	"fmt"
)

// Target is what Search looks for. A zero field is no target; at least one
// must be set.
type Target struct {
	// Slowdown is the largest acceptable projected μ (1 = as fast as the
	// traditional cluster).
	Slowdown float64 `json:"slowdown,omitempty"`
	// CostRatio is the smallest acceptable cost ratio, traditional/Lovelock,
	// fabric term included (2 = Lovelock at most half the cost).
	CostRatio float64 `json:"cost_ratio,omitempty"`
}

// SearchResult is the φ range that meets a Target and the model at the
// chosen φ.
type SearchResult struct {
	// Target is the target searched for.
	Target Target `json:"target"`
	// PhiMin is the smallest φ whose projected slowdown meets
	// Target.Slowdown; nil without a slowdown target.
	PhiMin *float64 `json:"phi_min,omitempty"`
	// PhiMax is the largest φ whose cost ratio meets Target.CostRatio; nil
	// without a cost target.
	PhiMax *float64 `json:"phi_max,omitempty"`
	// Phi is the chosen φ: PhiMin when there is a slowdown target (fewest
	// SmartNICs, so cheapest), else PhiMax (the most SmartNICs, so fastest,
	// the cost target allows).
	Phi float64 `json:"phi"`
	// Result is the model at Phi with μ projected from the workload.
	Result Result `json:"result"`
}

// Search finds the φ that meets t for the inputs in, in closed form. The
// projected slowdown μ(φ) = (c·r_cpu + n/r_bw)/φ + o falls as φ grows, so a
// slowdown target gives a smallest φ; the cost ratio falls as φ grows too, so
// a cost target gives a largest φ (the smallest is always φ → 0). With both,
// the range between them must not be empty. in.Phi, in.Mu and in.ProjectMu
// are ignored; μ is always projected from in.Workload. Errors wrap
// ErrInvalidInput or ErrUnreachable.
func Search(in Inputs, t Target) (SearchResult, error) {
	in.Phi, in.ProjectMu = 1, true // searched and projected, not read
	if err := in.Validate(); err != nil {
		return SearchResult{}, err
	}
	if t.Slowdown == 0 && t.CostRatio == 0 {
		return SearchResult{}, &InputError{Field: "Target", Reason: "set a slowdown or a cost-ratio target"}
	}
	res := SearchResult{Target: t}
	if t.Slowdown != 0 {
		phi, err := MinPhiForSlowdown(in.Workload, t.Slowdown)
		if err != nil {
			return SearchResult{}, err
		}
		res.PhiMin, res.Phi = &phi, phi
	}
	if t.CostRatio != 0 {
		phi, err := MaxPhiForCostRatio(in.ServerCost, in.FabricCost, in.PCIeCost, t.CostRatio)
		if err != nil {
			return SearchResult{}, err
		}
		res.PhiMax = &phi
		if res.PhiMin == nil {
			res.Phi = phi
		}
	}
	if res.PhiMin != nil && res.PhiMax != nil && *res.PhiMin > *res.PhiMax*(1+sumSlack) {
		return SearchResult{}, &UnreachableError{
			Field: "Target.Slowdown",
			Value: t.Slowdown,
			Reason: fmt.Sprintf("it needs φ >= %.4g but cost ratio >= %g allows φ <= %.4g; relax one of the targets",
				*res.PhiMin, t.CostRatio, *res.PhiMax),
		}
	}
	in.Phi = res.Phi
	r, err := Evaluate(in)
	var ie *InputError
	if errors.As(err, &ie) && ie.Field == "Phi" {
		// φ is what the search found, not an input: name the target
		// that chose it.
		field, v := "Target.CostRatio", t.CostRatio
		if res.PhiMin != nil {
			field, v = "Target.Slowdown", t.Slowdown
		}
		return SearchResult{}, &InputError{Field: field, Value: v, Reason: fmt.Sprintf("needs φ = %g, which %s", res.Phi, ie.Reason)}
	}
	if err != nil {
		return SearchResult{}, fmt.Errorf("planner: evaluate at φ = %g: %w", res.Phi, err)
	}
	res.Result = r
	return res, nil
}

// MinPhiForSlowdown returns the smallest φ whose projected slowdown is at
// most target: φ = (c·r_cpu + n/r_bw) / (target − o), where o is the
// unscaled share. A target at or below o cannot be met by any φ.
func MinPhiForSlowdown(w Workload, target float64) (float64, error) {
	if err := firstError(w.Validate(), positive("Target.Slowdown", target)); err != nil {
		return 0, err
	}
	work, other := w.scaledWork(), w.OtherShare()
	if work == 0 {
		return 0, &InputError{
			Field:  "Workload.CPUShare",
			Value:  w.CPUShare,
			Reason: "CPU and network shares are both 0, so the slowdown does not depend on φ; nothing to search",
		}
	}
	if target-other <= sumSlack { // equal to o up to rounding: φ would be unbounded
		return 0, &UnreachableError{
			Field: "Target.Slowdown",
			Value: target,
			Reason: fmt.Sprintf("%.4g of the run time is neither CPU nor network and does not shrink with φ; "+
				"ask for a slowdown above %.4g or raise the CPU or network share", other, other),
		}
	}
	phi := work / (target - other)
	if err := beyondRange("φ", phi, namedValue{"Workload.CPURatio", w.CPURatio},
		namedValue{"Workload.BandwidthRatio", w.BandwidthRatio}, namedValue{"Target.Slowdown", target}); err != nil {
		return 0, err
	}
	return phi, nil
}

// MaxPhiForCostRatio returns the largest φ whose cost ratio (fabric term
// included) is at least target: φ = ((c_s + c_f + c_p)/target − c_p) / (1 +
// c_f). With PCIe devices the ratio can never exceed (c_s + c_f + c_p)/c_p,
// however few SmartNICs are used, so larger targets are unreachable.
func MaxPhiForCostRatio(cs, cf, cp, target float64) (float64, error) {
	if err := firstError(
		positive("ServerCost", cs),
		nonNegative("FabricCost", cf),
		nonNegative("PCIeCost", cp),
		positive("Target.CostRatio", target),
	); err != nil {
		return 0, err
	}
	phi := ((cs+cf+cp)/target - cp) / (1 + cf)
	if err := beyondRange("φ", phi, namedValue{"ServerCost", cs}, namedValue{"FabricCost", cf},
		namedValue{"PCIeCost", cp}, namedValue{"Target.CostRatio", target}); err != nil {
		return 0, err
	}
	if phi <= 0 {
		limit := (cs + cf + cp) / cp
		return 0, &UnreachableError{
			Field: "Target.CostRatio",
			Value: target,
			Reason: fmt.Sprintf("the PCIe devices are bought either way, so the cost ratio stays below (c_s+c_f+c_p)/c_p = %.4g "+
				"for any φ; ask for less than %.4g", limit, limit),
		}
	}
	return phi, nil
}
