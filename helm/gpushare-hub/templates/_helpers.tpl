{{/* Labels every object of the release carries. */}}
{{- define "gpushare-hub.labels" -}}
app.kubernetes.io/name: gpushare-hub
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Selector labels of one component: (list $ "component"). */}}
{{- define "gpushare-hub.selector" -}}
app.kubernetes.io/name: gpushare-hub
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
One of our images: repository:tag, the tag the chart's appVersion when left empty (each release
of the chart names the images of the same release; a new version is a new tag, which nodes
holding the old one pull). Called with (dict "image" <values> "root" $).
*/}}
{{- define "gpushare-hub.image" -}}
{{ .image.repository }}:{{ .image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/*
kube-scheduler's tag: scheduler.image.tag when set, else the cluster's own version as an upstream
registry.k8s.io/kube-scheduler tag, v<major>.<minor>.<patch>. A vendor's build suffix
(v1.30.4+k3s1, v1.29.3-eks-adc7111, v1.31.2-gke.1000) is dropped; such clusters run the upstream
scheduler of the same release.
*/}}
{{- define "gpushare-hub.schedulerTag" -}}
{{- if .Values.scheduler.image.tag -}}
{{ .Values.scheduler.image.tag }}
{{- else -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{ printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch }}
{{- end -}}
{{- end }}

{{- define "gpushare-hub.schedulerImage" -}}
{{ .Values.scheduler.image.repository }}:{{ include "gpushare-hub.schedulerTag" . }}
{{- end }}

{{/*
A CEL list of strings: (list VALUES QUOTE), QUOTE being ' or '' (inside a single-quoted
YAML scalar). The schema allows no quote or backslash in the values.
*/}}
{{- define "gpushare-hub.celList" -}}
{{- $q := index . 1 -}}
{{- $items := list -}}
{{- range (index . 0) }}{{ $items = append $items (printf "%s%s%s" $q . $q) }}{{ end -}}
[{{ join ", " $items }}]
{{- end }}

{{/* The extender's URL as kube-scheduler calls it: the sidecar on 127.0.0.1. */}}
{{- define "gpushare-hub.extenderURL" -}}
{{ if .Values.extender.tls.enabled }}https{{ else }}http{{ end }}://127.0.0.1:{{ .Values.extender.port }}{{ .Values.extender.urlPrefix }}
{{- end }}

{{/* RBAC rules split by scope: (list RULES "cluster"|"namespace"). Configmaps and Leases are
needed only in the release namespace, so they go to a Role; everything else to a ClusterRole. */}}
{{- define "gpushare-hub.rules" -}}
{{- $scope := index . 1 -}}
{{- $out := list -}}
{{- range (index . 0) -}}
{{- $local := or (has "configmaps" .resources) (has "leases" .resources) -}}
{{- if eq $local (eq $scope "namespace") }}{{ $out = append $out . }}{{ end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end }}
