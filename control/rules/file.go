package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/lovelock-dpu/lovelock/bpf"
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

// ParseFile reads the rule file name holds data for, as Parse does, with two
// differences. A name ending in .json is read as strict JSON (RFC 8259: no
// trailing commas, comments or YAML), not as YAML, which accepts
// `{"name":"a","action":"drop",}`. And an error in a rule names the file, the
// line the rule starts on and the rule's name:
//
//	rules.yaml:12: rule "ingest": match: dport: want a whole number 0..65535, have "x"
//
// (a rule without a name is named by its position instead). In YAML the line
// is that of the rule's name; a YAML syntax error carries its own line.
func ParseFile(name string, data []byte) (*Set, error) {
	j := data
	isJSON := strings.EqualFold(filepath.Ext(name), ".json")
	if isJSON {
		if err := jsonSyntax(data); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	} else {
		var err error
		if j, err = yaml.YAMLToJSONStrict(data); err != nil {
			return nil, fmt.Errorf("%s: %w", name, YAMLError(data, err))
		}
	}
	if bytes.Equal(bytes.TrimSpace(j), []byte("null")) || len(bytes.TrimSpace(j)) == 0 {
		return nil, fmt.Errorf("%s: empty rule file", name)
	}
	s := &Set{}
	err := s.decode(j)
	var re *RuleError
	switch {
	case err == nil:
		return s, nil
	case errors.As(err, &re):
		line := 0
		if isJSON {
			line = jsonRuleLine(data, re.Index)
		} else {
			line = yamlRuleLine(data, re.Name, re.Index)
		}
		who := fmt.Sprintf("rule %q", re.Name)
		if re.Name == "" {
			who = fmt.Sprintf("rule %d (no name)", re.Index+1)
		}
		if line > 0 {
			return nil, fmt.Errorf("%s:%d: %s: %w", name, line, who, re.Err)
		}
		return nil, fmt.Errorf("%s: %s: %w", name, who, re.Err)
	}
	return nil, fmt.Errorf("%s: %w", name, YAMLError(data, err))
}

// jsonSyntax checks data is one JSON value and names the line of a syntax
// error.
func jsonSyntax(data []byte) error {
	d := json.NewDecoder(bytes.NewReader(data))
	var v json.RawMessage
	err := d.Decode(&v)
	if err == nil {
		if _, err2 := d.Token(); err2 != io.EOF {
			return fmt.Errorf("line %d: invalid JSON: more after the rule set", lineAt(data, int(d.InputOffset())))
		}
		return nil
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("line %d: invalid JSON: %v", lineAt(data, int(se.Offset)), se)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("invalid JSON: unexpected end of file")
	}
	return fmt.Errorf("invalid JSON: %w", err)
}

// lineAt is the 1-based line of byte offset off in data.
func lineAt(data []byte, off int) int {
	off = min(max(off, 0), len(data))
	return 1 + bytes.Count(data[:off], []byte("\n"))
}

// jsonRuleLine is the line on which element i of the top-level "rules" array
// starts, or 0.
func jsonRuleLine(data []byte, i int) int {
	d := json.NewDecoder(bytes.NewReader(data))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return 0
	}
	for d.More() {
		key, err := d.Token()
		if err != nil {
			return 0
		}
		if key != "rules" {
			var skip json.RawMessage
			if d.Decode(&skip) != nil {
				return 0
			}
			continue
		}
		if t, err := d.Token(); err != nil || t != json.Delim('[') {
			return 0
		}
		for n := 0; d.More(); n++ {
			off := int(d.InputOffset())
			// The element starts after the separator and white space.
			for off < len(data) && strings.IndexByte(" \t\r\n,", data[off]) >= 0 {
				off++
			}
			if n == i {
				return lineAt(data, off)
			}
			var skip json.RawMessage
			if d.Decode(&skip) != nil {
				return 0
			}
		}
		return 0
	}
	return 0
}

// yamlRuleLine is the line of the name of the rule at index i named name, or
// 0. It looks for `name: NAME` (quoted or not, block or flow style); a name
// used by several rules is found in order.
func yamlRuleLine(data []byte, name string, i int) int {
	if name == "" {
		return 0
	}
	re := regexp.MustCompile(`(^|[\s{,-])["']?name["']?\s*:\s*["']?` + regexp.QuoteMeta(name) + `["']?\s*($|[,}#])`)
	// How many rules before i carry the same name: duplicates are errors
	// too, and the k-th one is the k-th occurrence.
	k := 0
	var prior struct {
		Rules []struct{ Name string } `json:"rules"`
	}
	if j, err := yaml.YAMLToJSON(data); err == nil && json.Unmarshal(j, &prior) == nil {
		for n := 0; n < i && n < len(prior.Rules); n++ {
			if prior.Rules[n].Name == name {
				k++
			}
		}
	}
	for ln, text := range strings.Split(string(data), "\n") {
		if re.MatchString(text) {
			if k == 0 {
				return ln + 1
			}
			k--
		}
	}
	return 0
}

var yamlUnknownField = regexp.MustCompile(`unknown field "([^"]+)"`)

// YAMLError rewrites an error of sigs.k8s.io/yaml's strict decoding of data
// so that it says where: "line N: unknown field "x"" instead of "error
// unmarshaling JSON: while decoding JSON: json: unknown field "x"", which
// the YAML-to-JSON conversion leaves without a line. The line is the first
// one on which the field appears as a key. Other errors come back as they
// are (YAML syntax errors carry their own line). Callers prefix the file
// name: fmt.Errorf("%s: %w", path, rules.YAMLError(data, err)).
func YAMLError(data []byte, err error) error {
	if err == nil {
		return nil
	}
	if strings.Contains(err.Error(), "cannot unmarshal bool into") {
		return fmt.Errorf("%w (YAML reads an unquoted on, off, yes or no as true or false: quote the value, \"off\")", err)
	}
	m := yamlUnknownField.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	field := m[1]
	key := regexp.MustCompile(`(^|[\s{,-])["']?` + regexp.QuoteMeta(field) + `["']?\s*:`)
	for ln, text := range strings.Split(string(data), "\n") {
		if key.MatchString(text) {
			return fmt.Errorf("line %d: unknown field %q", ln+1, field)
		}
	}
	return fmt.Errorf("unknown field %q", field)
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

// RuleError is an error in one rule of a set: Parse reports it by position
// and name, ParseFile by file, line and name.
type RuleError struct {
	Index int    // the rule's position in the file, from 0
	Name  string // the rule's name, "" when it has none
	Err   error
}

func (e *RuleError) Error() string {
	if e.Name == "" {
		return fmt.Sprintf("rule %d: %v", e.Index+1, e.Err)
	}
	return fmt.Sprintf("rule %d %q: %v", e.Index+1, e.Name, e.Err)
}

func (e *RuleError) Unwrap() error { return e.Err }

// ruleError prefixes err with the rule's position (from 1) and name.
func ruleError(i int, name string, err error) error {
	return &RuleError{Index: i, Name: name, Err: err}
}

// Sweeping returns the rules of s that match every packet (no match at
// all) and drop or redirect it: a rule file that forgot its match. The CLI
// refuses them without --force.
func (s *Set) Sweeping() []Rule {
	var out []Rule
	for _, r := range s.Rules {
		if r.Match == (Match{}) && (r.Action.Verb == bpf.ActionDrop || r.Action.Verb == bpf.ActionRedirect) {
			out = append(out, r)
		}
	}
	return out
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
