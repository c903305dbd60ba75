package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// The file format, as JSON sees it (YAML is converted to JSON first, so one
// set of tags serves both). Values that may be a name or a number stay raw
// until the rule's name is known, so that every error can name its rule.
type (
	fileSet struct {
		Default *string           `json:"default"`
		Rules   []json.RawMessage `json:"rules"`
	}
	fileRule struct {
		Name     *string         `json:"name"`
		ID       json.RawMessage `json:"id"`
		Priority json.RawMessage `json:"priority"`
		Match    json.RawMessage `json:"match"`
		Action   *string         `json:"action"`
	}
	fileMatch struct {
		Iface  json.RawMessage `json:"iface"`
		Src    json.RawMessage `json:"src"`
		Dst    json.RawMessage `json:"dst"`
		Proto  json.RawMessage `json:"proto"`
		Sport  json.RawMessage `json:"sport"`
		Dport  json.RawMessage `json:"dport"`
		Type   json.RawMessage `json:"type"`
		Tenant json.RawMessage `json:"tenant"`
		Rank   json.RawMessage `json:"rank"`
		Region json.RawMessage `json:"region"`
	}
)

const (
	setFields   = "default, rules"
	ruleFields  = "name, id, priority, match, action"
	matchFields = "iface, src, dst, proto, sport, dport, type, tenant, rank, region"
)

// Parse reads a rule file, YAML or JSON:
//
//	default: pass
//	rules:
//	  - name: ingest
//	    priority: 100
//	    match: {dst: 10.1.0.0/16, type: ingest-input, rank: 0-15}
//	    action: xsk:3
//
// It is strict: unknown or duplicate fields are errors, and so are values of
// the wrong kind. Errors name the line (YAML syntax) or the rule (by position
// and name). Parse checks the syntax only; Validate, Compile and
// NewClassifier check what a set means. An omitted default is pass.
func Parse(data []byte) (*Set, error) {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("rules: parse: %w", err)
	}
	if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
		return nil, errors.New("rules: parse: empty rule file")
	}
	s := &Set{}
	if err := s.decode(j); err != nil {
		return nil, fmt.Errorf("rules: parse: %w", err)
	}
	return s, nil
}

// UnmarshalJSON reads a set in the rule file's JSON form, as strictly as
// Parse.
func (s *Set) UnmarshalJSON(b []byte) error {
	if err := s.decode(b); err != nil {
		return fmt.Errorf("rules: %w", err)
	}
	return nil
}

func (s *Set) decode(j []byte) error {
	var fs fileSet
	if err := strictJSON(j, &fs, setFields); err != nil {
		return err
	}
	*s = Set{Default: Pass()}
	if fs.Default != nil {
		var err error
		if s.Default, err = ParseAction(*fs.Default); err != nil {
			return fmt.Errorf("default: %w", err)
		}
	}
	s.Rules = make([]Rule, 0, len(fs.Rules))
	for i, raw := range fs.Rules {
		r, err := parseRule(raw)
		if err != nil {
			return ruleError(i, r.Name, err)
		}
		s.Rules = append(s.Rules, r)
	}
	return nil
}

// UnmarshalJSON reads one rule in the rule file's JSON form, as strictly as
// Parse.
func (r *Rule) UnmarshalJSON(b []byte) error {
	v, err := parseRule(b)
	if err != nil {
		if v.Name != "" {
			return fmt.Errorf("rules: rule %q: %w", v.Name, err)
		}
		return fmt.Errorf("rules: rule: %w", err)
	}
	*r = v
	return nil
}

// UnmarshalJSON reads a match in the rule file's JSON form.
func (m *Match) UnmarshalJSON(b []byte) error {
	var fm fileMatch
	if err := strictJSON(b, &fm, matchFields); err != nil {
		return fmt.Errorf("rules: match: %w", err)
	}
	v, err := parseMatch(&fm)
	if err != nil {
		return fmt.Errorf("rules: match: %w", err)
	}
	*m = v
	return nil
}

// ruleError prefixes err with the rule's position (from 1) and name.
func ruleError(i int, name string, err error) error {
	if name == "" {
		return fmt.Errorf("rule %d: %w", i+1, err)
	}
	return fmt.Errorf("rule %d %q: %w", i+1, name, err)
}

// strictJSON decodes j into v, rejecting unknown fields; known lists the
// fields for the error message.
func strictJSON(j []byte, v any, known string) error {
	d := json.NewDecoder(bytes.NewReader(j))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		switch msg := err.Error(); {
		case strings.HasPrefix(msg, "json: unknown field "):
			return fmt.Errorf("unknown field %s (known: %s)", strings.TrimPrefix(msg, "json: unknown field "), known)
		case errors.As(err, &te) && te.Field != "":
			return fmt.Errorf("%s: want %s, got %s", te.Field, kindOf(te.Type.Kind().String()), te.Value)
		case errors.As(err, &te):
			return fmt.Errorf("want an object with %s, got %s", known, te.Value)
		}
		return err
	}
	return nil
}

func kindOf(goKind string) string {
	switch goKind {
	case "slice":
		return "a list"
	case "ptr", "string":
		return "a string"
	}
	return goKind
}

// parseRule decodes one rule. It returns the name as soon as it has it, for
// the caller's error message.
func parseRule(raw json.RawMessage) (Rule, error) {
	var (
		fr fileRule
		r  Rule
	)
	if err := strictJSON(raw, &fr, ruleFields); err != nil {
		// Find the name for the message, if the rule has one.
		var named struct{ Name string }
		_ = json.Unmarshal(raw, &named)
		r.Name = named.Name
		return r, err
	}
	if fr.Name != nil {
		r.Name = *fr.Name
	}
	if r.Name == "" {
		return r, errors.New("no name: every rule needs a unique name")
	}
	var err error
	if r.ID, err = number(fr.ID, "id", MaxID); err != nil {
		return r, err
	}
	if r.Priority, err = number(fr.Priority, "priority", 1<<32-1); err != nil {
		return r, err
	}
	if fr.Action == nil {
		return r, errors.New("no action: want pass, drop, redirect:<iface> or xsk:<queue>")
	}
	if r.Action, err = ParseAction(*fr.Action); err != nil {
		return r, err
	}
	if isNull(fr.Match) {
		return r, nil // no match: every packet
	}
	var fm fileMatch
	if err := strictJSON(fr.Match, &fm, matchFields); err != nil {
		return r, fmt.Errorf("match: %w", err)
	}
	r.Match, err = parseMatch(&fm)
	if err != nil {
		return r, fmt.Errorf("match: %w", err)
	}
	return r, nil
}

func parseMatch(fm *fileMatch) (Match, error) {
	var m Match
	var err error
	if !isNull(fm.Iface) {
		if m.Iface, err = scalar(fm.Iface, "iface"); err != nil {
			return m, err
		}
		if m.Iface == "" {
			return m, errors.New("iface: empty name")
		}
	}
	for _, p := range []struct {
		raw  json.RawMessage
		name string
		dst  *netip.Prefix
	}{{fm.Src, "src", &m.Src}, {fm.Dst, "dst", &m.Dst}} {
		if isNull(p.raw) {
			continue
		}
		s, err := scalar(p.raw, p.name)
		if err != nil {
			return m, err
		}
		if *p.dst, err = parsePrefix(s); err != nil {
			return m, fmt.Errorf("%s: %w", p.name, err)
		}
	}
	if !isNull(fm.Proto) {
		s, err := scalar(fm.Proto, "proto")
		if err != nil {
			return m, err
		}
		p, err := ParseProto(s)
		if err != nil {
			return m, err
		}
		m.Proto = &p
	}
	for _, p := range []struct {
		raw  json.RawMessage
		name string
		dst  **uint16
	}{{fm.Sport, "sport", &m.Sport}, {fm.Dport, "dport", &m.Dport}} {
		if isNull(p.raw) {
			continue
		}
		n, err := number(p.raw, p.name, 1<<16-1)
		if err != nil {
			return m, err
		}
		*p.dst = new(uint16(n))
	}
	if !isNull(fm.Type) {
		s, err := scalar(fm.Type, "type")
		if err != nil {
			return m, err
		}
		t, err := ParseType(s)
		if err != nil {
			return m, err
		}
		m.Type = &t
	}
	for _, p := range []struct {
		raw  json.RawMessage
		name string
		dst  **uint32
	}{{fm.Tenant, "tenant", &m.Tenant}, {fm.Region, "region", &m.Region}} {
		if isNull(p.raw) {
			continue
		}
		n, err := number(p.raw, p.name, 1<<32-1)
		if err != nil {
			return m, err
		}
		*p.dst = new(n)
	}
	if !isNull(fm.Rank) {
		s, err := scalar(fm.Rank, "rank")
		if err != nil {
			return m, err
		}
		r, err := ParseRank(s)
		if err != nil {
			return m, err
		}
		m.Rank = &r
	}
	return m, nil
}

// parsePrefix reads a prefix, or a bare address as a host prefix. Host bits
// are kept, so that Validate can point at them.
func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q is neither a prefix nor an address", s)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("bad prefix %q: want addr/len, e.g. 10.1.0.0/16 or fd00::/64", s)
	}
	return p, nil
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// scalar returns a string or a number's text.
func scalar(raw json.RawMessage, field string) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		return n.String(), nil
	}
	if string(raw) == "true" || string(raw) == "false" {
		return "", fmt.Errorf("%s: want a string or a number, have %s (YAML reads yes, no, on, off, true and false unquoted as booleans: quote them)", field, raw)
	}
	return "", fmt.Errorf("%s: want a string or a number, have %s", field, raw)
}

// number reads an unsigned integer up to max, as a JSON number or a string
// of digits; absent is 0.
func number(raw json.RawMessage, field string, max uint64) (uint32, error) {
	if isNull(raw) {
		return 0, nil
	}
	s, err := scalar(raw, field)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > max {
		return 0, fmt.Errorf("%s: want a whole number 0..%d, have %s", field, max, raw)
	}
	return uint32(n), nil
}

// The output form of Format.
type (
	outSet struct {
		Default string    `json:"default"`
		Rules   []outRule `json:"rules"`
	}
	outRule struct {
		Name     string   `json:"name"`
		ID       uint32   `json:"id,omitempty"`
		Priority uint32   `json:"priority"`
		Match    outMatch `json:"match,omitzero"`
		Action   string   `json:"action"`
	}
	outMatch struct {
		Iface  string  `json:"iface,omitempty"`
		Src    string  `json:"src,omitempty"`
		Dst    string  `json:"dst,omitempty"`
		Proto  string  `json:"proto,omitempty"`
		Sport  *uint16 `json:"sport,omitempty"`
		Dport  *uint16 `json:"dport,omitempty"`
		Type   string  `json:"type,omitempty"`
		Tenant *uint32 `json:"tenant,omitempty"`
		Rank   string  `json:"rank,omitempty"`
		Region *uint32 `json:"region,omitempty"`
	}
)

// Format writes s as a YAML rule file that Parse reads back into an equal
// Set.
func Format(s *Set) ([]byte, error) {
	b, err := yaml.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("rules: format: %w", err)
	}
	return b, nil
}

// MarshalJSON writes s in the rule file's JSON form.
func (s Set) MarshalJSON() ([]byte, error) {
	out := outSet{Default: s.Default.String(), Rules: make([]outRule, 0, len(s.Rules))}
	for _, r := range s.Rules {
		out.Rules = append(out.Rules, r.out())
	}
	return json.Marshal(out)
}

// MarshalJSON writes r in the rule file's JSON form.
func (r Rule) MarshalJSON() ([]byte, error) { return json.Marshal(r.out()) }

// MarshalJSON writes m in the rule file's JSON form.
func (m Match) MarshalJSON() ([]byte, error) { return json.Marshal(m.out()) }

func (r Rule) out() outRule {
	return outRule{Name: r.Name, ID: r.ID, Priority: r.Priority, Match: r.Match.out(), Action: r.Action.String()}
}

func (m Match) out() outMatch {
	om := outMatch{Iface: m.Iface, Sport: m.Sport, Dport: m.Dport, Tenant: m.Tenant, Region: m.Region}
	if m.Src.IsValid() {
		om.Src = m.Src.String()
	}
	if m.Dst.IsValid() {
		om.Dst = m.Dst.String()
	}
	if m.Proto != nil {
		om.Proto = ProtoName(*m.Proto)
	}
	if m.Type != nil {
		om.Type = typeText(*m.Type)
	}
	if m.Rank != nil {
		om.Rank = m.Rank.String()
	}
	return om
}

// typeText is a type's name, or its number when it has none.
func typeText(t wire.Type) string {
	if t.Known() {
		return t.String()
	}
	return strconv.Itoa(int(t))
}
