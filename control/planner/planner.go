// Package planner owns Lovelock's cost and energy model: how a cluster of
// servers compares with a Lovelock cluster in which every server is replaced
// by φ headless SmartNICs.
//
// It implements, as pure functions, the analytic model of §4 of the Lovelock
// paper (Park et al., "Lovelock: Towards Smart NIC-hosted Clusters"): the cost
// ratio of eq. 1, the power (energy) ratio of eq. 2, PCIe-device terms derived
// from a share of system cost, the linear fabric-cost extension of §5.2, the
// BigQuery-style run-time projection of §5.2, and a closed-form search for the
// φ that meets a target slowdown or cost ratio. PaperScenarios and PaperClaims
// carry every worked number of the paper next to what the model computes.
//
// Every quantity is a ratio relative to one SmartNIC: a ServerCost (c_s) of 7
// means one server costs as much as seven SmartNICs. Ratios returned by the
// model are traditional/Lovelock, so a value above 1 favours Lovelock. The
// package does no I/O and holds no mutable state; `lovelock plan` is its
// command-line front end.
package planner

import (
	"errors"
	"fmt"
	"math"
)

// ErrInvalidInput is wrapped by every *InputError, so callers can test for
// any validation failure with errors.Is.
var ErrInvalidInput = errors.New("invalid input")

// ErrUnreachable is wrapped by every *UnreachableError: a search target that
// no φ > 0 can meet.
var ErrUnreachable = errors.New("target unreachable")

// InputError reports one input outside its domain.
type InputError struct {
	// Field names the input as a Go field path of Inputs, Workload or Target,
	// e.g. "Phi" or "Workload.CPUShare"; front ends map it to their own names.
	Field string
	// Value is the rejected value.
	Value float64
	// Reason says what the value must be.
	Reason string
}

// Error implements error.
func (e *InputError) Error() string {
	return fmt.Sprintf("planner: %s = %g: %s", e.Field, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidInput.
func (e *InputError) Unwrap() error { return ErrInvalidInput }

// UnreachableError reports a search target that no φ > 0 meets.
type UnreachableError struct {
	// Field names the target as "Target.Slowdown" or "Target.CostRatio".
	Field string
	// Value is the requested target.
	Value float64
	// Reason explains the bound the target violates and what to change.
	Reason string
}

// Error implements error.
func (e *UnreachableError) Error() string {
	return fmt.Sprintf("planner: %s = %g is unreachable: %s", e.Field, e.Value, e.Reason)
}

// Unwrap returns ErrUnreachable.
func (e *UnreachableError) Unwrap() error { return ErrUnreachable }

// Inputs are the parameters of the model, each relative to one SmartNIC.
type Inputs struct {
	// ServerCost is c_s, the capital cost of one server relative to one
	// SmartNIC. Paper: $10500 / $1500 = 7 (BlueField-2 white paper).
	ServerCost float64 `json:"server_cost"`
	// ServerPower is p_s, the power draw of one server relative to one
	// SmartNIC. Paper: 728 W / 65 W = 11.2 (printed as "≈ 11" in §4).
	ServerPower float64 `json:"server_power"`
	// PCIeCost is c_p, the cost of the PCIe devices (GPUs, SSDs) attached to
	// a server, or to a SmartNIC in Lovelock, relative to one SmartNIC. Use
	// FromShare to derive it from the devices' share of system cost.
	PCIeCost float64 `json:"pcie_cost"`
	// PCIePower is p_p, the power of those PCIe devices relative to one
	// SmartNIC.
	PCIePower float64 `json:"pcie_power"`
	// FabricCost is c_f, the network fabric (ports, ToR, links) cost per
	// traditional server relative to one SmartNIC. As in §5.2, every SmartNIC
	// of the Lovelock cluster needs as much fabric as a server did, so fabric
	// cost grows linearly with φ. Zero gives the plain eq. 1.
	FabricCost float64 `json:"fabric_cost"`
	// Phi is φ, the number of SmartNICs provisioned per replaced server.
	Phi float64 `json:"phi"`
	// Mu is μ, the slowdown accepted on application run time (Lovelock run
	// time / traditional run time; 1.2 is 20% slower). Ignored when ProjectMu
	// is set.
	Mu float64 `json:"mu"`
	// ProjectMu takes μ from Workload.Project(Phi) instead of Mu.
	ProjectMu bool `json:"project_mu"`
	// Workload describes where a traditional cluster spends its time; it is
	// used by ProjectMu and by Search.
	Workload Workload `json:"workload"`
}

// DefaultInputs returns the paper's headline configuration (§4): c_s = 7,
// p_s = 11.2, no PCIe devices, no fabric term, φ = 3, μ = 1.2, and the
// BigQuery workload of §5.2 for projections.
func DefaultInputs() Inputs {
	return Inputs{
		ServerCost:  7,
		ServerPower: 11.2,
		Phi:         3,
		Mu:          1.2,
		Workload:    DefaultWorkload(),
	}
}

// Validate checks every input and returns the first *InputError found.
func (in Inputs) Validate() error {
	checks := []error{
		positive("ServerCost", in.ServerCost),
		positive("ServerPower", in.ServerPower),
		nonNegative("PCIeCost", in.PCIeCost),
		nonNegative("PCIePower", in.PCIePower),
		nonNegative("FabricCost", in.FabricCost),
		positive("Phi", in.Phi),
	}
	if !in.ProjectMu {
		checks = append(checks, positive("Mu", in.Mu))
	}
	checks = append(checks, in.Workload.Validate())
	return firstError(checks...)
}

// Result is the model evaluated for one set of Inputs.
type Result struct {
	// Phi is φ as evaluated.
	Phi float64 `json:"phi"`
	// Mu is the slowdown used for the energy ratio: Inputs.Mu, or the
	// projected one when Projection is set.
	Mu float64 `json:"mu"`
	// DeviceCostRatio is eq. 1 without fabric: (c_s + c_p) / (φ + c_p).
	DeviceCostRatio float64 `json:"device_cost_ratio"`
	// CostRatio is the cost ratio including the fabric term,
	// (c_s + c_f + c_p) / (φ(1 + c_f) + c_p); equal to DeviceCostRatio when
	// c_f = 0.
	CostRatio float64 `json:"cost_ratio"`
	// EnergyRatio is eq. 2: (p_s + p_p) / (μ(φ + p_p)).
	EnergyRatio float64 `json:"energy_ratio"`
	// CostSaving is the share of capital cost Lovelock saves, 1 − 1/CostRatio
	// (negative when Lovelock costs more).
	CostSaving float64 `json:"cost_saving"`
	// EnergySaving is the share of energy Lovelock saves, 1 − 1/EnergyRatio.
	EnergySaving float64 `json:"energy_saving"`
	// FabricCapacity is 1/μ, the fabric capacity relative to the traditional
	// cluster's that keeps pace with the application (§5.2): below 1 the
	// fabric may be slower, above 1 it must be faster.
	FabricCapacity float64 `json:"fabric_capacity"`
	// Projection is the run-time breakdown when μ was projected.
	Projection *Projection `json:"projection,omitempty"`
}

// Evaluate validates in and computes eq. 1 (with the fabric term), eq. 2,
// the savings and the fabric capacity needed.
func Evaluate(in Inputs) (Result, error) {
	if err := in.Validate(); err != nil {
		return Result{}, err
	}
	r := Result{Phi: in.Phi, Mu: in.Mu}
	if in.ProjectMu {
		p, err := in.Workload.Project(in.Phi)
		if err != nil {
			return Result{}, fmt.Errorf("planner: project slowdown: %w", err)
		}
		r.Mu = p.Slowdown
		r.Projection = &p
	}
	// The inputs are valid, so the formulas below cannot fail.
	r.DeviceCostRatio = costRatio(in.ServerCost, 0, in.PCIeCost, in.Phi)
	r.CostRatio = costRatio(in.ServerCost, in.FabricCost, in.PCIeCost, in.Phi)
	r.EnergyRatio = powerRatio(in.ServerPower, in.PCIePower, in.Phi, r.Mu)
	r.CostSaving = 1 - 1/r.CostRatio
	r.EnergySaving = 1 - 1/r.EnergyRatio
	r.FabricCapacity = 1 / r.Mu
	// Valid inputs far from 1 (φ = 1e-320, μ = 1e-310, c_f = 1e308)
	// overflow the formulas: a ratio of +Inf, or a saving of −Inf, would be
	// printed as such and cannot be written as JSON.
	used := []namedValue{
		{"ServerCost", in.ServerCost}, {"ServerPower", in.ServerPower}, {"PCIeCost", in.PCIeCost},
		{"PCIePower", in.PCIePower}, {"FabricCost", in.FabricCost}, {"Phi", in.Phi},
	}
	if in.ProjectMu {
		used = append(used, namedValue{"Workload.CPURatio", in.Workload.CPURatio},
			namedValue{"Workload.BandwidthRatio", in.Workload.BandwidthRatio})
	} else {
		used = append(used, namedValue{"Mu", in.Mu})
	}
	for _, v := range []namedValue{
		{"μ", r.Mu}, {"a device cost ratio", r.DeviceCostRatio}, {"a cost ratio", r.CostRatio},
		{"an energy ratio", r.EnergyRatio}, {"a cost saving", r.CostSaving},
		{"an energy saving", r.EnergySaving}, {"a fabric capacity", r.FabricCapacity},
	} {
		if err := beyondRange(v.field, v.v, used...); err != nil {
			return Result{}, err
		}
	}
	return r, nil
}

// namedValue is an input or a result with its name.
type namedValue struct {
	field string
	v     float64
}

// beyondRange returns an *InputError when the result v (named what) is
// not a finite number, which only valid inputs far from 1 cause. It names
// the input furthest from 1, in orders of magnitude, as the one to change.
func beyondRange(what string, v float64, inputs ...namedValue) error {
	if !math.IsNaN(v) && !math.IsInf(v, 0) {
		return nil
	}
	worst, far := namedValue{}, -1.0
	for _, in := range inputs {
		if in.v == 0 { // a zero term cannot overflow anything
			continue
		}
		if d := math.Abs(math.Log10(math.Abs(in.v))); d > far {
			worst, far = in, d
		}
	}
	return &InputError{
		Field: worst.field,
		Value: worst.v,
		Reason: fmt.Sprintf("gives %s of %g, beyond what the model can compute; "+
			"use a value nearer 1 (inputs are relative to one SmartNIC)", what, v),
	}
}

func finite(field string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return &InputError{Field: field, Value: v, Reason: "must be a finite number"}
	}
	return nil
}

func positive(field string, v float64) error {
	if err := finite(field, v); err != nil {
		return err
	}
	if v <= 0 {
		return &InputError{Field: field, Value: v, Reason: "must be greater than 0"}
	}
	return nil
}

func nonNegative(field string, v float64) error {
	if err := finite(field, v); err != nil {
		return err
	}
	if v < 0 {
		return &InputError{Field: field, Value: v, Reason: "must be 0 or more"}
	}
	return nil
}

// share checks a share of a whole that cannot be all of it: [0, 1).
func share(field string, v float64) error {
	if err := finite(field, v); err != nil {
		return err
	}
	if v < 0 || v >= 1 {
		return &InputError{Field: field, Value: v, Reason: "must be in [0, 1), e.g. 0.75 for 75%"}
	}
	return nil
}

// fraction checks a fraction that may be all of the whole: [0, 1].
func fraction(field string, v float64) error {
	if err := finite(field, v); err != nil {
		return err
	}
	if v < 0 || v > 1 {
		return &InputError{Field: field, Value: v, Reason: "must be in [0, 1], e.g. 0.61 for 61%"}
	}
	return nil
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
