{{/*
Names and labels, as `helm create` writes them.
*/}}
{{- define "recserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "recserve.fullname" -}}
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

{{- define "recserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "recserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "recserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "recserve.labels" -}}
helm.sh/chart: {{ include "recserve.chart" . }}
{{ include "recserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: inference-server
{{- end }}

{{- define "recserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "recserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "recserve.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
Where the chart mounts things in the server container.
*/}}
{{- define "recserve.configDir" -}}/etc/recserve{{- end }}
{{- define "recserve.configFile" -}}{{ include "recserve.configDir" . }}/recserve.toml{{- end }}
{{- define "recserve.modelDir" -}}/models{{- end }}

{{/*
host:port for a listener: IPv6 addresses in brackets.
*/}}
{{- define "recserve.listenAddr" -}}
{{- $host := index . 0 }}{{- $port := index . 1 }}
{{- if contains ":" $host }}[{{ $host }}]:{{ $port }}{{ else }}{{ $host }}:{{ $port }}{{ end }}
{{- end }}

{{/*
Seconds from the pod being marked terminating to SIGKILL: the preStop sleep, the server's drain, and a margin.
*/}}
{{- define "recserve.terminationGracePeriodSeconds" -}}
{{- $needed := add (int .Values.lifecycle.preStopSleepSeconds) (int .Values.server.shutdownTimeoutSeconds) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $needed 5 }}
{{- else if lt (int .Values.terminationGracePeriodSeconds) $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be at least lifecycle.preStopSleepSeconds + server.shutdownTimeoutSeconds (%d), or requests in flight are cut off on every rollout" (int .Values.terminationGracePeriodSeconds) $needed) }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
TOML for the server's config file. Helm reads every number in values as a float, and `toToml` would write
`executors = 2.0`, which the server refuses; so integral numbers are written as integers here. Strings are
written as JSON strings, which are valid TOML basic strings.
*/}}
{{- define "recserve.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{- define "recserve.tomlValue" -}}
{{- $kind := kindOf . }}
{{- if eq $kind "string" }}{{ toJson . }}
{{- else if eq $kind "bool" }}{{ . }}
{{- else if has $kind (list "float64" "float32" "int" "int64" "int32" "uint64") }}
{{- if eq (float64 .) (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if eq $kind "slice" }}[{{ range $i, $e := . }}{{ if $i }}, {{ end }}{{ include "recserve.tomlValue" $e }}{{ end }}]
{{- else }}{{ fail (printf "config: a %s value cannot be written to the config file" $kind) }}
{{- end }}
{{- end }}

{{/* A table: its plain keys first, then its sub-tables with dotted headers. Takes (list prefix map). */}}
{{- define "recserve.tomlTable" -}}
{{- $prefix := index . 0 }}{{- $table := index . 1 }}
{{- range $key := keys $table | sortAlpha }}
{{- $value := index $table $key }}
{{- if kindIs "invalid" $value }}
{{- else if not (kindIs "map" $value) }}
{{ include "recserve.tomlKey" $key }} = {{ include "recserve.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key := keys $table | sortAlpha }}
{{- $value := index $table $key }}
{{- if kindIs "map" $value }}
{{- $name := include "recserve.tomlKey" $key }}
{{- $header := ternary $name (printf "%s.%s" $prefix $name) (eq $prefix "") }}

[{{ $header }}]
{{- include "recserve.tomlTable" (list $header $value) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The whole config file: the chart's settings, then .Values.config.
*/}}
{{- define "recserve.configToml" -}}
{{- range $key := list "repository" "http_addr" "grpc_addr" "shutdown_timeout_s" "otlp_endpoint" "trace_sample_ratio" "access_log_sample_ratio" }}
{{- if hasKey $.Values.config $key }}
{{- fail (printf "config.%s is set by the chart; use %s instead" $key (get (dict "repository" "modelRepository" "http_addr" "server.httpPort and server.bindAddress" "grpc_addr" "server.grpc" "shutdown_timeout_s" "server.shutdownTimeoutSeconds" "otlp_endpoint" "tracing.otlpEndpoint" "trace_sample_ratio" "tracing.sampleRatio" "access_log_sample_ratio" "tracing.accessLogSampleRatio") $key)) }}
{{- end }}
{{- end -}}
# Written by the recserve Helm chart (release {{ .Release.Name }}): the chart's settings, then .Values.config.
# Flags (server.extraArgs) and RECSERVE_* environment variables (server.env) override this file.
repository = {{ include "recserve.modelDir" . | toJson }}
http_addr = {{ include "recserve.listenAddr" (list .Values.server.bindAddress .Values.server.httpPort) | toJson }}
{{- if .Values.server.grpc.enabled }}
grpc_addr = {{ include "recserve.listenAddr" (list .Values.server.bindAddress .Values.server.grpc.port) | toJson }}
{{- end }}
shutdown_timeout_s = {{ int .Values.server.shutdownTimeoutSeconds }}
{{- with .Values.tracing }}
{{- if .otlpEndpoint }}
otlp_endpoint = {{ .otlpEndpoint | toJson }}
trace_sample_ratio = {{ .sampleRatio | float64 }}
{{- end }}
{{- if gt (.accessLogSampleRatio | float64) 0.0 }}
access_log_sample_ratio = {{ .accessLogSampleRatio | float64 }}
{{- end }}
{{- end }}
{{- include "recserve.tomlTable" (list "" .Values.config) }}
{{- end }}
