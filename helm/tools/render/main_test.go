package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Helm's --set typing (pkg/strvals): ints become int64, true/false bools,
// null deletes, everything else (floats included) stays a string.
func TestParseSetTypes(t *testing.T) {
	v := values{}
	if err := parseSet(v, `a.b=0.42,a.c=5,a.d=true,a.e=null,a.f=007,a.g=x\,y,l={1,z}`, false); err != nil {
		t.Fatal(err)
	}
	a := v["a"].(map[string]interface{})
	want := map[string]interface{}{"b": "0.42", "c": int64(5), "d": true, "e": nil, "f": "007", "g": "x,y"}
	for k, w := range want {
		if !reflect.DeepEqual(a[k], w) {
			t.Errorf("a.%s = %#v, want %#v", k, a[k], w)
		}
	}
	if !reflect.DeepEqual(v["l"], []interface{}{int64(1), "z"}) {
		t.Errorf("l = %#v", v["l"])
	}
	s := values{}
	if err := parseSet(s, "a=5", true); err != nil || s["a"] != "5" {
		t.Errorf("--set-string a=5 gave %#v (%v)", s["a"], err)
	}
}

// A null in user values deletes the chart default; maps merge.
func TestCoalesce(t *testing.T) {
	def := values{"a": values{"x": 1.0, "y": 2.0}, "b": 3.0}
	got := coalesce(values{"a": values{"y": nil, "z": "n"}, "b": 4.0}, def)
	want := values{"a": values{"x": 1.0, "z": "n"}, "b": 4.0}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("coalesce = %#v, want %#v", got, want)
	}
}

// Values numbers are float64 as in Helm: printed directly a big one shows
// as 1e+06 (Helm's well-known behaviour); toYaml keeps it an integer.
func TestRenderNumbersLikeHelm(t *testing.T) {
	dir := t.TempDir()
	must := func(p, s string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must(filepath.Join(dir, "Chart.yaml"), "apiVersion: v2\nname: c\nversion: 1.2.3\nappVersion: \"9\"\n")
	must(filepath.Join(dir, "values.yaml"), "big: 1000000\nm: {k: 0.5}\n")
	must(filepath.Join(dir, "files", "f.txt"), "hello")
	must(filepath.Join(dir, "templates", "_h.tpl"), `{{- define "c.x" -}}{{ .Chart.Name }}-{{ .Chart.Version }}{{- end }}`)
	must(filepath.Join(dir, "templates", "cm.yaml"), `apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "c.x" . }}
  namespace: {{ .Release.Namespace }}
data:
  raw: "{{ .Values.big }}"
  yaml: |
    {{- toYaml .Values | nindent 4 }}
  file: {{ .Files.Get "files/f.txt" | quote }}
  missing: "{{ .Values.nope }}"
`)
	out, err := run(options{release: "r", namespace: "ns", chartDir: dir, sets: []string{"m.k=0.25"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Source: c/templates/cm.yaml", "name: c-1.2.3", "namespace: ns",
		`raw: "1e+06"`, "big: 1000000", `k: "0.25"`, `file: "hello"`, `missing: ""`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	must(filepath.Join(dir, "templates", "bad.yaml"), `{{ required "x.y is required" .Values.x }}`)
	if _, err := run(options{release: "r", namespace: "ns", chartDir: dir}); err == nil ||
		!strings.Contains(err.Error(), "x.y is required") {
		t.Errorf("required: err = %v", err)
	}
}
