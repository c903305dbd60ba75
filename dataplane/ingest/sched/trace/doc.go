// Package trace reads and writes pod traces in the format of Alibaba's
// cluster-trace-gpu-v2023 (openb_pod_list_*.csv, openb_node_list_*.csv),
// maps pods to scheduler requests (Map, documented in docs/scheduling.md),
// and generates synthetic traces with the same columns (Synth).
package trace
