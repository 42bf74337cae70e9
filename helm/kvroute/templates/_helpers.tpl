{{/* Chart name, shortened to the 63 characters Kubernetes allows in names. */}}
{{- define "kvroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: RELEASE-CHART, or RELEASE when it already contains the chart name. */}}
{{- define "kvroute.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvroute.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "kvroute.labels" -}}
helm.sh/chart: {{ include "kvroute.chart" . }}
{{ include "kvroute.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of the router pods (immutable once installed). */}}
{{- define "kvroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end }}

{{/* Labels of the bundled NATS objects. */}}
{{- define "kvroute.nats.labels" -}}
helm.sh/chart: {{ include "kvroute.chart" . }}
{{ include "kvroute.nats.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.nats.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of the bundled NATS pod. */}}
{{- define "kvroute.nats.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}-nats
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: nats
{{- end }}

{{- define "kvroute.nats.fullname" -}}
{{- printf "%s-nats" (include "kvroute.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvroute.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Name of the Secret with admin-token / nats-url, or "" when there is none. */}}
{{- define "kvroute.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else if .Values.secret.create }}
{{- include "kvroute.fullname" . }}
{{- end }}
{{- end }}

{{/* True ("true") when NATS credentials are set in values. */}}
{{- define "kvroute.natsCredentials" -}}
{{- if .Values.secret.natsUser }}
{{- $ok := "^[A-Za-z0-9._~-]+$" }}
{{- if not (regexMatch $ok .Values.secret.natsUser) }}
{{- fail "secret.natsUser: use URL-safe characters (A-Z a-z 0-9 . _ ~ -), or put a full nats-url in secret.existingSecret" }}
{{- end }}
{{- if not (regexMatch $ok (required "secret.natsPassword is required when secret.natsUser is set" .Values.secret.natsPassword)) }}
{{- fail "secret.natsPassword: use URL-safe characters (A-Z a-z 0-9 . _ ~ -), or put a full nats-url in secret.existingSecret" }}
{{- end }}
{{- "true" }}
{{- end }}
{{- end }}

{{/* The NATS URL written to kvroute.yaml (without credentials). */}}
{{- define "kvroute.natsUrl" -}}
{{- if .Values.config.events.nats_url }}
{{- .Values.config.events.nats_url }}
{{- else if .Values.nats.enabled }}
{{- printf "nats://%s:%d" (include "kvroute.nats.fullname" .) (int .Values.nats.port) }}
{{- else if or .Values.config.workers.static .Values.config.discovery.dns .Values.pools }}
{{- /* No NATS: workers from the config or DNS, KV events over ZMQ. */}}
{{- else }}
{{- fail "config.events.nats_url is empty and nats.enabled is false: set config.events.nats_url to your NATS server, or list workers in config.workers.static / config.discovery.dns / pools (vLLM/SGLang over ZMQ, no NATS)" }}
{{- end }}
{{- end }}

{{/* The NATS URL with credentials (secret key nats-url). */}}
{{- define "kvroute.natsUrlWithCredentials" -}}
{{- $url := include "kvroute.natsUrl" . }}
{{- if contains "," $url }}
{{- fail "config.events.nats_url lists several servers: put the full URL list with credentials in secret.existingSecret (key nats-url)" }}
{{- end }}
{{- $u := urlParse $url }}
{{- printf "%s://%s:%s@%s" $u.scheme .Values.secret.natsUser .Values.secret.natsPassword $u.host }}
{{- end }}

{{/*
The daemon configuration: .Values.config as YAML, with events.nats_url
resolved. admin.token must stay empty (a ConfigMap is not secret); ports must
be fixed (the probes and Services point at them).
*/}}
{{- define "kvroute.config" -}}
{{- if .Values.config.admin.token }}
{{- fail "config.admin.token must stay empty (a ConfigMap is not secret): set secret.adminToken or secret.existingSecret" }}
{{- end }}
{{- if not (and .Values.config.router.port .Values.config.admin.port) }}
{{- fail "config.router.port and config.admin.port must be fixed ports (not 0) in Kubernetes" }}
{{- end }}
{{- $cfg := deepCopy .Values.config }}
{{- $_ := set $cfg.events "nats_url" (include "kvroute.natsUrl" .) }}
{{- include "kvroute.pools" (dict "pools" (.Values.pools | default list) "cfg" $cfg) }}
{{- toYaml $cfg }}
{{- end }}

{{/*
pools: each role-labelled pool becomes one discovery.dns entry (host) or one
workers.static entry per worker (workers), with the pool's role, model and
shared fields; appended to what config already lists. Fails naming the key.
*/}}
{{- define "kvroute.pools" -}}
{{- $cfg := .cfg }}
{{- $dns := $cfg.discovery.dns | default list }}
{{- $static := $cfg.workers.static | default list }}
{{- $names := dict }}
{{- if not (kindIs "slice" .pools) }}{{ fail "pools must be a list of pools ({name, role, model, host or workers})" }}{{ end }}
{{- range $i, $p := .pools }}
{{- $at := printf "pools[%d]" $i }}
{{- if not (kindIs "map" $p) }}{{ fail (printf "%s must be a mapping with name, role, model and host or workers" $at) }}{{ end }}
{{- if not $p.name }}{{ fail (printf "%s.name is required" $at) }}{{ end }}
{{- $at = printf "pools[%d] (%s)" $i $p.name }}
{{- if hasKey $names (toString $p.name) }}{{ fail (printf "%s.name: two pools are named %q" $at $p.name) }}{{ end }}
{{- $_ := set $names (toString $p.name) true }}
{{- if not (has (toString ($p.role | default "")) (list "prefill" "decode" "both")) }}
{{- fail (printf "%s.role must be prefill, decode or both (got %q)" $at (toString ($p.role | default ""))) }}
{{- end }}
{{- if not $p.model }}{{ fail (printf "%s.model is required" $at) }}{{ end }}
{{- if and (hasKey $p "bootstrap_port") (ne (toString $p.role) "prefill") }}
{{- fail (printf "%s.bootstrap_port: only a prefill pool has one (SGLang --disaggregation-bootstrap-port)" $at) }}
{{- end }}
{{- if and $p.host $p.workers }}{{ fail (printf "%s: host and workers are exclusive (DNS or a static list)" $at) }}{{ end }}
{{- $shared := omit $p "name" "workers" }}
{{- if $p.host }}
{{- if not $p.port }}{{ fail (printf "%s.port is required with host" $at) }}{{ end }}
{{- $dns = append $dns $shared }}
{{- else if $p.workers }}
{{- range $j, $w := $p.workers }}
{{- if not (and (kindIs "map" $w) $w.url) }}{{ fail (printf "%s.workers[%d].url is required" $at $j) }}{{ end }}
{{- $static = append $static (merge (deepCopy $w) $shared) }}
{{- end }}
{{- else }}
{{- fail (printf "%s: host (a headless Service) or workers (a list of {url, ...}) is required" $at) }}
{{- end }}
{{- end }}
{{- $_ := set $cfg.discovery "dns" $dns }}
{{- $_ := set $cfg.workers "static" $static }}
{{- end }}

{{/* terminationGracePeriodSeconds: preStop sleep + drain grace + margin. */}}
{{- define "kvroute.terminationGracePeriodSeconds" -}}
{{- $grace := divf .Values.config.router.shutdown_grace_ms 1000 | ceil | int }}
{{- add (int .Values.lifecycle.preStopSleepSeconds) $grace (int .Values.lifecycle.terminationExtraSeconds) }}
{{- end }}

{{/* nats.conf of the bundled NATS server; $VARS are expanded by nats-server from its environment. */}}
{{- define "kvroute.nats.conf" -}}
port: {{ .Values.nats.port }}
http_port: {{ .Values.nats.monitorPort }}
server_name: $POD_NAME
pid_file: /var/run/nats/nats.pid
{{- if .Values.nats.jetstream.enabled }}
jetstream {
  store_dir: /data
  max_memory_store: {{ .Values.nats.jetstream.maxMemory }}
  max_file_store: {{ .Values.nats.jetstream.maxFile }}
}
{{- end }}
{{- if include "kvroute.natsCredentials" . }}
authorization {
  user: $NATS_USER
  password: $NATS_PASSWORD
}
{{- end }}
{{- end }}
