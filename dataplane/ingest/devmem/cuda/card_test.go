package cuda

import "testing"

func TestCardName(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name string
		mem  uint64
		want string
	}{
		{"NVIDIA H100 80GB HBM3", 81559 << 20, "H100-80GB"},
		{"NVIDIA H100 PCIe", 81559 << 20, "H100-80GB"},
		{"NVIDIA H100 NVL", 95830 << 20, ""},
		{"NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984 << 20, "H100-80GB"},
		{"NVIDIA A100-SXM4-40GB", 40536 << 20, "A100-40GB"},
		{"NVIDIA A100-PCIE-40GB", 40536 << 20, "A100-40GB"},
		{"NVIDIA A100-SXM4-80GB", 81920 << 20, "A100-80GB"},
		{"NVIDIA A100 80GB PCIe", 81920 << 20, "A100-80GB"},
		{"NVIDIA H200", 143771 << 20, "H200-141GB"},
		{"NVIDIA H200 NVL", 143771 << 20, "H200-141GB"},
		{"NVIDIA GH200 480GB", 97871 << 20, ""},
		{"NVIDIA L4", 23 * gib, ""},
		{"Tesla V100-SXM2-16GB", 16 * gib, ""},
		{"NVIDIA A100 123GB", 123 * gib, ""},
		{"", 0, ""},
	} {
		if got := CardName(tc.name, tc.mem); got != tc.want {
			t.Errorf("CardName(%q, %d MiB) = %q, want %q", tc.name, tc.mem>>20, got, tc.want)
		}
	}
}
