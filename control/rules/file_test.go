package rules

import (
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestParseFile holds ParseFile to issue 10's item 7: .json is strict JSON,
// and errors name the file, the rule's line and its name.
func TestParseFile(t *testing.T) {
	for _, c := range []struct {
		name, file, data string
		want             string // "" for success; otherwise the whole error
	}{
		{"json-trailing-comma", "r.json", `{"rules": [{"name":"a","action":"drop",}]}`,
			"r.json: line 1: invalid JSON: invalid character '}' looking for beginning of object key string"},
		{"json-yaml-syntax", "r.json", "rules:\n  - {name: a, action: drop}\n",
			"r.json: line 1: invalid JSON: invalid character 'r' looking for beginning of value"},
		{"json-two-documents", "r.json", `{"rules": []} {}`, "r.json: line 1: invalid JSON: more after the rule set"},
		{"json-ok", "r.JSON", "{\n \"default\": \"pass\",\n \"rules\": [{\"name\": \"a\", \"match\": {\"dport\": 53}, \"action\": \"drop\"}]\n}\n", ""},
		{"json-rule-line", "r.json", "{\"rules\": [\n  {\"name\": \"a\", \"action\": \"drop\"},\n\n  {\"name\": \"b\",\n   \"match\": {\"dport\": \"x\"}, \"action\": \"drop\"}\n]}\n",
			`r.json:4: rule "b": match: dport: want a whole number 0..65535, have "x"`},
		{"json-unnamed-rule", "r.json", "{\"rules\": [\n {\"action\": \"drop\"}]}", `r.json:2: rule 1 (no name): no name: every rule needs a unique name`},
		{"yaml-rule-line", "r.yaml", "default: pass\nrules:\n  - name: a\n    action: drop\n    match: {dport: 53}\n  - name: b\n    priority: 5\n    match: {proto: udp, dport: 70000}\n    action: drop\n",
			`r.yaml:6: rule "b": match: dport: want a whole number 0..65535, have 70000`},
		{"yaml-flow-rule-line", "r.yaml", "rules:\n- {name: a, action: drop, match: {dport: 1}}\n- {name: 'b', action: fly}\n",
			`r.yaml:3: rule "b": action "fly": want pass, drop, redirect:<iface> or xsk:<queue>`},
		{"yaml-unknown-field", "r.yaml", "rules:\n  - name: a\n    action: drop\n    mtach: {dport: 1}\n",
			`r.yaml:2: rule "a": unknown field "mtach" (known: name, id, priority, match, action)`},
		{"yaml-unknown-top-field", "r.yaml", "default: pass\nrulez: []\n", `r.yaml: line 2: unknown field "rulez"`},
		{"yaml-empty", "r.yaml", "\n", "r.yaml: empty rule file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseFile(c.file, []byte(c.data))
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("err = %v", err)
			case c.want != "" && (err == nil || err.Error() != c.want):
				t.Fatalf("err = %v\nwant  %s", err, c.want)
			}
		})
	}
	// Parse, which has no file name, reads the trailing comma as YAML; only
	// a .json name makes it strict.
	if _, err := Parse([]byte(`{"rules": [{"name":"a","action":"drop",}]}`)); err != nil {
		t.Errorf("Parse of YAML flow style: %v", err)
	}
}

func TestSweeping(t *testing.T) {
	s, err := ParseFile("r.yaml", []byte(`rules:
  - {name: everything, action: drop}
  - {name: away, action: "redirect:p1"}
  - {name: fine, action: pass}
  - {name: to-worker, action: "xsk:0"}
  - {name: scoped, match: {dport: 53}, action: drop}
`))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range s.Sweeping() {
		names = append(names, r.Name)
	}
	if got := strings.Join(names, ","); got != "everything,away" {
		t.Errorf("Sweeping = %s, want everything,away", got)
	}
}

// TestYAMLError: the error sigs.k8s.io/yaml's UnmarshalStrict gives for an
// unknown field (as appliance/config's Load meets it) gets its line.
func TestYAMLError(t *testing.T) {
	var cfg struct {
		Socket string `json:"socket"`
		Pins   string `json:"pins"`
	}
	data := []byte("socket: /run/x.sock\n# comment\npins: /sys/fs/bpf/x\nmetrcs: 127.0.0.1:9\n")
	err := yaml.UnmarshalStrict(data, &cfg)
	if err == nil || !strings.Contains(err.Error(), "error unmarshaling JSON") {
		t.Fatalf("UnmarshalStrict: %v (the case this helper exists for)", err)
	}
	if got := YAMLError(data, err); got == nil || got.Error() != `line 4: unknown field "metrcs"` {
		t.Errorf("YAMLError = %v", got)
	}
	other := errors.New("yaml: line 2: mapping values are not allowed in this context")
	if YAMLError(data, other) != other {
		t.Error("a syntax error was changed")
	}
}
