package planner

// CostRatio is eq. 1 of the paper: the capital cost of a traditional cluster
// over that of a Lovelock cluster with φ SmartNICs per server,
// (c_s + c_p) / (φ + c_p). Above 1, Lovelock is cheaper.
func CostRatio(cs, cp, phi float64) (float64, error) {
	return CostRatioWithFabric(cs, 0, cp, phi)
}

// CostRatioWithFabric is eq. 1 extended with network fabric cost as in §5.2:
// (c_s + c_f + c_p) / (φ·(1 + c_f) + c_p). Each SmartNIC needs as much fabric
// as a server did, so fabric cost scales linearly with φ; the paper calls this
// pessimistic, since the fabric only has to keep pace with the (slower)
// application. With c_f = 0 it is eq. 1.
func CostRatioWithFabric(cs, cf, cp, phi float64) (float64, error) {
	if err := firstError(
		positive("ServerCost", cs),
		nonNegative("FabricCost", cf),
		nonNegative("PCIeCost", cp),
		positive("Phi", phi),
	); err != nil {
		return 0, err
	}
	return costRatio(cs, cf, cp, phi), nil
}

func costRatio(cs, cf, cp, phi float64) float64 {
	return (cs + cf + cp) / (phi*(1+cf) + cp)
}

// PowerRatio is eq. 2 of the paper: the energy of a traditional cluster over
// that of a Lovelock cluster, (p_s + p_p) / (μ·(φ + p_p)). Power draw is
// multiplied by run time, so a slowdown μ costs energy. Above 1, Lovelock uses
// less energy.
func PowerRatio(ps, pp, phi, mu float64) (float64, error) {
	if err := firstError(
		positive("ServerPower", ps),
		nonNegative("PCIePower", pp),
		positive("Phi", phi),
		positive("Mu", mu),
	); err != nil {
		return 0, err
	}
	return powerRatio(ps, pp, phi, mu), nil
}

func powerRatio(ps, pp, phi, mu float64) float64 {
	return (ps + pp) / (mu * (phi + pp))
}

// FromShare derives the PCIe-device term from the devices' share s of a
// traditional node's total cost (or power), as in §4: if the devices are s of
// the system, they are s/(1−s) times the server, so c_p = c_s·s/(1−s) (and
// p_p = p_s·s/(1−s)). The paper's 75% gives c_p = 7·3 = 21, p_p = 11.2·3 =
// 33.6. server is c_s or p_s and must be positive; s must be in [0, 1).
func FromShare(server, s float64) (float64, error) {
	if err := firstError(positive("server", server), share("share", s)); err != nil {
		return 0, err
	}
	return server * s / (1 - s), nil
}

// FabricFromFraction derives c_f as a fraction of the server cost, as §5.2
// does: "c_f ... may be assumed to be c_s × 10% = 0.7". Note the paper calls
// this "10% of traditional cluster" cost, but c_f = 0.1·c_s is 0.7/7.7 ≈ 9.1%
// of a server plus its fabric; this function follows the paper's arithmetic.
// f must be in [0, 1).
func FabricFromFraction(cs, f float64) (float64, error) {
	if err := firstError(positive("ServerCost", cs), share("fabric fraction", f)); err != nil {
		return 0, err
	}
	return cs * f, nil
}

// Relative turns absolute figures (dollars, watts) into the model's ratio
// relative to one SmartNIC: server / smartNIC. The paper's $10500 / $1500 = 7
// and 728 W / 65 W = 11.2 come from the BlueField-2 white paper.
func Relative(server, smartNIC float64) (float64, error) {
	if err := firstError(positive("server", server), positive("smartNIC", smartNIC)); err != nil {
		return 0, err
	}
	return server / smartNIC, nil
}

// Saving converts a traditional/Lovelock ratio into the share Lovelock saves,
// 1 − 1/ratio: a 3.5x cost ratio is a 71% cost saving. The paper's "21%-71%
// capital cost, 23%-80% energy" claims are savings in this sense.
func Saving(ratio float64) (float64, error) {
	if err := positive("ratio", ratio); err != nil {
		return 0, err
	}
	return 1 - 1/ratio, nil
}

// FabricCapacity returns 1/μ, the fabric capacity relative to the traditional
// cluster's that keeps up with an application slowed down by μ (§5.2): μ =
// 1.22 lets the fabric be 18% slower, μ = 0.81 needs it 23% faster.
func FabricCapacity(mu float64) (float64, error) {
	if err := positive("Mu", mu); err != nil {
		return 0, err
	}
	return 1 / mu, nil
}
