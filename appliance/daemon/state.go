package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
)

// State is the desired state lovelockd records after every change and
// reconciles at start.
type State struct {
	Attachments []attach.Attachment `json:"attachments"`
	Rules       rules.Set           `json:"rules"`
	// HasRules is false until a rule set was applied; until then the
	// config's rule file, if any, is the starting set.
	HasRules bool `json:"has_rules"`
	// RuleFileIDs are the IDs the config's rule file's rules went live
	// under, by name, recorded while the rule file is the starting set
	// (HasRules false). The file gives no IDs, and rule counters are kept
	// by ID: the next start gives each rule the ID its name had, so an
	// edited file keeps every rule's counters with it, and a rule the
	// record lacks starts from zero. Absent (a state file of an earlier
	// version, or none): every rule starts from zero.
	RuleFileIDs map[string]uint32 `json:"rule_file_ids,omitempty"`
}

// ruleFileSet is RuleFileIDs as the set of rules the data plane counts.
func (s State) ruleFileSet() rules.Set {
	var set rules.Set
	for name, id := range s.RuleFileIDs {
		set.Rules = append(set.Rules, rules.Rule{Name: name, ID: id})
	}
	return set
}

// LoadState reads the state file; a missing file is an empty state.
func LoadState(path string) (State, error) {
	var s State
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("state file: %w", err)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("state file %s: %w (move it away to start from the config alone)", path, err)
	}
	return s, nil
}

// Save writes the state file atomically: a crash leaves the old or the new
// file, never a torn one.
func (s State) Save(path string) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".state-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	// The rename is durable once the directory is: without this, a power
	// loss could bring back the state file before the change.
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}
