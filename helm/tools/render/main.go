// kvroute-helm-render renders a Helm 3 chart without the helm binary, the way
// `helm template NAME CHART` does, for CI and for machines without helm.
//
// Faithful to Helm 3 in what the kvroute chart uses: values are read with
// sigs.k8s.io/yaml (numbers become float64, as in Helm), -f files and --set /
// --set-string are merged in Helm's order and coalesced over the chart's
// values.yaml (a null deletes a default), templates run on text/template with
// sprig's TxtFuncMap minus env/expandenv plus Helm's toYaml, fromYaml,
// toJson, fromJson, include, tpl, required, lookup (always empty, as in
// `helm template`), "missingkey=zero" and "<no value>" erased. Built-in
// objects: .Values, .Release (Name, Namespace, Service, IsInstall, IsUpgrade,
// Revision), .Chart (Chart.yaml fields), .Files (Get, GetBytes, Lines, Glob),
// .Template (Name, BasePath), .Capabilities (KubeVersion, APIVersions.Has with
// the built-in API groups only, as `helm template` without --api-versions).
//
// Not implemented: subcharts and dependencies, .helmignore, hooks, schema
// (values.schema.json), CRDs/, --set-file, --set-json, list indexes in --set.
//
// Output: every non-partial template under templates/ (with --notes: only
// the rendered NOTES.txt), split into documents, ordered by Helm's install order of kinds,
// each as "---\n# Source: CHART/templates/FILE\n<doc>\n", as helm template
// prints them.
//
// Usage: kvroute-helm-render [-f values.yaml]... [--set k=v]... [--set-string k=v]...
//
//	[-n namespace] [--notes] [--show-only templates/x.yaml] RELEASE CHARTDIR
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"sigs.k8s.io/yaml"
)

// ---- values ----

type values = map[string]interface{}

func readValues(file string) (values, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var v values
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if v == nil {
		v = values{}
	}
	return v, nil
}

// mergeMaps is Helm's cli/values mergeMaps: b wins, maps merge recursively.
func mergeMaps(a, b values) values {
	out := make(values, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if vm, ok := v.(map[string]interface{}); ok {
			if bv, ok := out[k]; ok {
				if bvm, ok := bv.(map[string]interface{}); ok {
					out[k] = mergeMaps(bvm, vm)
					continue
				}
			}
		}
		out[k] = v
	}
	return out
}

// coalesce is Helm's chartutil.CoalesceTables for one chart: user values over
// chart defaults; a null user value deletes the default.
func coalesce(user, defaults values) values {
	out := values{}
	for k, v := range defaults {
		out[k] = v
	}
	for k, v := range user {
		if v == nil {
			delete(out, k)
			continue
		}
		um, uok := v.(map[string]interface{})
		dm, dok := out[k].(map[string]interface{})
		if uok && dok {
			out[k] = coalesce(um, dm)
		} else {
			out[k] = v
		}
	}
	return out
}

// typedVal is Helm's strvals type inference for --set.
func typedVal(s string, asString bool) interface{} {
	if asString {
		return s
	}
	switch {
	case strings.EqualFold(s, "true"):
		return true
	case strings.EqualFold(s, "false"):
		return false
	case strings.EqualFold(s, "null"):
		return nil
	case s == "0":
		return int64(0)
	}
	if len(s) > 0 && s[0] != '0' {
		if iv, err := strconv.ParseInt(s, 10, 64); err == nil {
			return iv
		}
	}
	return s
}

// splitUnescaped splits on sep, honouring backslash escapes (kept out).
func splitUnescaped(s string, sep rune) []string {
	var parts []string
	var cur strings.Builder
	esc := false
	for _, r := range s {
		switch {
		case esc:
			cur.WriteRune(r)
			esc = false
		case r == '\\':
			esc = true
		case r == sep:
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	return append(parts, cur.String())
}

// parseSet applies "a.b=c,d.e=f" to dst (Helm strvals subset: dotted keys,
// comma-separated pairs, "\," and "\." escapes, {x,y} lists of scalars).
func parseSet(dst values, expr string, asString bool) error {
	// Split pairs on commas outside braces.
	var pairs []string
	depth, start, esc := 0, 0, false
	for i, r := range expr {
		switch {
		case esc:
			esc = false
		case r == '\\':
			esc = true
		case r == '{':
			depth++
		case r == '}':
			depth--
		case r == ',' && depth == 0:
			pairs = append(pairs, expr[start:i])
			start = i + 1
		}
	}
	pairs = append(pairs, expr[start:])
	for _, p := range pairs {
		eq := strings.IndexRune(p, '=')
		if eq < 0 {
			return fmt.Errorf("--set %q: key %q has no value", expr, p)
		}
		keys := splitUnescaped(p[:eq], '.')
		raw := p[eq+1:]
		var val interface{}
		if strings.HasPrefix(raw, "{") && strings.HasSuffix(raw, "}") {
			list := []interface{}{}
			if inner := raw[1 : len(raw)-1]; inner != "" {
				for _, e := range splitUnescaped(inner, ',') {
					list = append(list, typedVal(e, asString))
				}
			}
			val = list
		} else {
			val = typedVal(strings.Join(splitUnescaped(raw, ','), ","), asString)
		}
		m := dst
		for i, k := range keys {
			if strings.ContainsAny(k, "[]") {
				return fmt.Errorf("--set %q: list indexes are not supported by this renderer", p)
			}
			if i == len(keys)-1 {
				m[k] = val
				break
			}
			next, ok := m[k].(map[string]interface{})
			if !ok {
				next = values{}
				m[k] = next
			}
			m = next
		}
	}
	return nil
}

// ---- built-in objects ----

// Metadata mirrors the Chart.yaml fields of Helm's chart.Metadata that
// templates read (.Chart.Name, .Chart.Version, .Chart.AppVersion, ...).
type Metadata struct {
	Name        string            `json:"name,omitempty"`
	Home        string            `json:"home,omitempty"`
	Sources     []string          `json:"sources,omitempty"`
	Version     string            `json:"version,omitempty"`
	Description string            `json:"description,omitempty"`
	Keywords    []string          `json:"keywords,omitempty"`
	Icon        string            `json:"icon,omitempty"`
	APIVersion  string            `json:"apiVersion,omitempty"`
	Condition   string            `json:"condition,omitempty"`
	Tags        string            `json:"tags,omitempty"`
	AppVersion  string            `json:"appVersion,omitempty"`
	Deprecated  bool              `json:"deprecated,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	KubeVersion string            `json:"kubeVersion,omitempty"`
	Type        string            `json:"type,omitempty"`
}

// Files is Helm's .Files: every chart file outside templates/ and the
// chart's own Chart.yaml / values.yaml.
type Files map[string][]byte

func (f Files) GetBytes(name string) []byte { return f[name] }
func (f Files) Get(name string) string      { return string(f[name]) }
func (f Files) Lines(name string) []string {
	if f[name] == nil {
		return []string{}
	}
	return strings.Split(string(f[name]), "\n")
}
func (f Files) Glob(pattern string) Files {
	out := Files{}
	for k, v := range f {
		if ok, _ := path.Match(pattern, k); ok {
			out[k] = v
		}
	}
	return out
}

type apiVersions []string

func (a apiVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

// ---- Helm's extra template functions (pkg/engine/funcs.go) ----

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromYAMLArray(str string) []interface{} {
	a := []interface{}{}
	if err := yaml.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(str string) map[string]interface{} {
	m := make(map[string]interface{})
	if err := json.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(str string) []interface{} {
	a := []interface{}{}
	if err := json.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

// ---- rendering ----

// installOrder is Helm's releaseutil.InstallOrder.
var installOrder = []string{"Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
	"PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass", "PersistentVolume",
	"PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
	"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod",
	"ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
	"IngressClass", "Ingress", "APIService"}

type manifest struct {
	source string
	kind   string
	seq    int
	body   string
}

var docSep = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

type options struct {
	release, namespace, chartDir string
	valueFiles, sets, setStrings []string
	notes                        bool
	showOnly                     []string
}

func run(o options) (string, error) {
	chartYAML, err := os.ReadFile(filepath.Join(o.chartDir, "Chart.yaml"))
	if err != nil {
		return "", err
	}
	var meta Metadata
	if err := yaml.Unmarshal(chartYAML, &meta); err != nil {
		return "", fmt.Errorf("Chart.yaml: %w", err)
	}
	if meta.Name == "" || meta.Version == "" {
		return "", fmt.Errorf("Chart.yaml: name and version are required")
	}

	defaults, err := readValues(filepath.Join(o.chartDir, "values.yaml"))
	if err != nil {
		return "", err
	}
	user := values{}
	for _, f := range o.valueFiles {
		v, err := readValues(f)
		if err != nil {
			return "", err
		}
		user = mergeMaps(user, v)
	}
	for _, s := range o.sets {
		if err := parseSet(user, s, false); err != nil {
			return "", err
		}
	}
	for _, s := range o.setStrings {
		if err := parseSet(user, s, true); err != nil {
			return "", err
		}
	}
	vals := coalesce(user, defaults)

	// Templates and files.
	templates := map[string]string{}
	files := Files{}
	err = filepath.Walk(o.chartDir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(o.chartDir, p)
		rel = filepath.ToSlash(rel)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(rel, "templates/"):
			templates[meta.Name+"/"+rel] = string(data)
		case rel == "Chart.yaml" || rel == "values.yaml":
		default:
			files[rel] = data
		}
		return nil
	})
	if err != nil {
		return "", err
	}

	names := make([]string, 0, len(templates))
	for n := range templates {
		names = append(names, n)
	}
	// Helm's sortTemplates: deeper paths first, then reverse lexical order.
	sort.Slice(names, func(i, j int) bool {
		ci, cj := strings.Count(names[i], "/"), strings.Count(names[j], "/")
		if ci != cj {
			return ci > cj
		}
		return names[i] > names[j]
	})

	t := template.New("gotpl").Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	extra := template.FuncMap{
		"toYaml": toYAML, "fromYaml": fromYAML, "fromYamlArray": fromYAMLArray,
		"toJson": toJSON, "fromJson": fromJSON, "fromJsonArray": fromJSONArray,
		"toToml": func(interface{}) string { return "toToml is not implemented by kvroute-helm-render" },
	}
	for k, v := range extra {
		funcs[k] = v
	}
	included := map[string]int{}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		if included[name] > 1000 {
			return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
		}
		included[name]++
		defer func() { included[name]-- }()
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["required"] = func(warn string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, fmt.Errorf("%s", warn)
		}
		if s, ok := val.(string); ok && s == "" {
			return val, fmt.Errorf("%s", warn)
		}
		return val, nil
	}
	funcs["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	funcs["tpl"] = func(tpl string, vals interface{}) (string, error) {
		c, err := t.Clone()
		if err != nil {
			return "", err
		}
		c, err = c.New("tpl").Parse(tpl)
		if err != nil {
			return "", fmt.Errorf("cannot parse template %q: %w", tpl, err)
		}
		var buf strings.Builder
		if err := c.Execute(&buf, vals); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", tpl, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	t.Funcs(funcs)
	for _, n := range names {
		if _, err := t.New(n).Parse(templates[n]); err != nil {
			return "", fmt.Errorf("parse error: %w", err)
		}
	}

	top := map[string]interface{}{
		"Values": vals,
		"Release": map[string]interface{}{
			"Name": o.release, "Namespace": o.namespace, "Service": "Helm",
			"IsInstall": true, "IsUpgrade": false, "Revision": 1,
		},
		"Chart": &meta,
		"Files": files,
		"Capabilities": map[string]interface{}{
			"KubeVersion": map[string]interface{}{"Version": "v1.20.0", "Major": "1", "Minor": "20",
				"GitVersion": "v1.20.0"},
			"APIVersions": apiVersions{"v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v2",
				"networking.k8s.io/v1", "rbac.authorization.k8s.io/v1"},
			"HelmVersion": map[string]interface{}{"Version": "v3"},
		},
	}

	var out, notes strings.Builder
	var manifests []manifest
	sort.Strings(names)
	for _, n := range names {
		base := path.Base(n)
		if strings.HasPrefix(base, "_") {
			continue
		}
		// NOTES.txt is always rendered (its errors fail the render, as in
		// helm) but printed only with --notes, instead of the manifests.
		isNotes := base == "NOTES.txt"
		if len(o.showOnly) > 0 && !contains(o.showOnly, strings.TrimPrefix(n, meta.Name+"/")) && !isNotes {
			continue
		}
		scope := map[string]interface{}{}
		for k, v := range top {
			scope[k] = v
		}
		scope["Template"] = map[string]interface{}{"Name": n, "BasePath": meta.Name + "/templates"}
		var buf bytes.Buffer
		if err := t.ExecuteTemplate(&buf, n, scope); err != nil {
			return "", err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if isNotes {
			notes.WriteString(text)
			continue
		}
		if strings.TrimSpace(text) == "" {
			continue
		}
		for i, d := range docSep.Split("\n"+text, -1) {
			d = strings.TrimSpace(d)
			if d == "" {
				continue
			}
			var head struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(d), &head); err != nil {
				return "", fmt.Errorf("YAML parse error on %s: %w\n%s", n, err, d)
			}
			manifests = append(manifests, manifest{source: n, kind: head.Kind, seq: i, body: d})
		}
	}
	order := map[string]int{}
	for i, k := range installOrder {
		order[k] = i
	}
	sort.SliceStable(manifests, func(i, j int) bool {
		a, b := manifests[i], manifests[j]
		oa, aok := order[a.kind]
		ob, bok := order[b.kind]
		switch {
		case !aok && !bok:
			return a.kind < b.kind
		case !aok:
			return false
		case !bok:
			return true
		}
		return oa < ob
	})
	if o.notes {
		return notes.String(), nil
	}
	for _, m := range manifests {
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", m.source, m.body)
	}
	return out.String(), nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage: kvroute-helm-render [-f values.yaml]... [--set k=v]... [--set-string k=v]...
                           [-n namespace] [--notes] [--show-only templates/x.yaml] RELEASE CHARTDIR
Renders the chart like "helm template RELEASE CHARTDIR" to stdout.`)
	os.Exit(2)
}

func main() {
	o := options{namespace: "default"}
	var pos []string
	args := os.Args[1:]
	next := func(i *int, flag string) string {
		if *i+1 >= len(args) {
			fmt.Fprintf(os.Stderr, "kvroute-helm-render: %s needs a value\n", flag)
			usage()
		}
		*i++
		return args[*i]
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") {
			args = append(args[:i+1], append([]string{v}, args[i+1:]...)...)
			a = k
		}
		switch a {
		case "-f", "--values":
			o.valueFiles = append(o.valueFiles, next(&i, a))
		case "--set":
			o.sets = append(o.sets, next(&i, a))
		case "--set-string":
			o.setStrings = append(o.setStrings, next(&i, a))
		case "-n", "--namespace":
			o.namespace = next(&i, a)
		case "--notes":
			o.notes = true
		case "-s", "--show-only":
			o.showOnly = append(o.showOnly, next(&i, a))
		case "-h", "--help":
			usage()
		default:
			if strings.HasPrefix(a, "-") {
				fmt.Fprintf(os.Stderr, "kvroute-helm-render: unknown flag %s\n", a)
				usage()
			}
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		usage()
	}
	o.release, o.chartDir = pos[0], pos[1]
	out, err := run(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
	fmt.Print(out)
}
