// Package sched places accelerator work (inference requests and jobs) on MIG
// slices of a fleet of GPUs: which GPU, which profile, which start slot, when.
// It owns the workload model (Request), the placement policies (naive,
// first-fit, best-fit and Lovelock's heuristic) behind one Scheduler (Place
// per arrival, Release per completion), the Dispatcher that adds the request
// path's queue and retries, and Lovelock's windowed planner, and that the
// ingest agent drives, the exact solver for small instances that checks the
// heuristic and plans small windows (Solve, with WriteLP for an external MILP
// solver), and the discrete-event simulator that replays traces through any
// policy (Simulate, Fill).
//
// The objective is Conspirator's eq. 1: fewest GPUs in use plus deadline
// misses weighted by size, with the real MIG geometry of package mig in place
// of the paper's capacity sum (its constraint 1d), and fragmentation growth
// (as in FGD, Weng et al., ATC '23) as the tie-breaker.
package sched
