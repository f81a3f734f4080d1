{{/*
What the device plugin's DaemonSet and the DRA plugin's (dra.yaml) share: the flags that say
how the node's cards are read and handed out, their environment, the host folders and the
pod-level settings, all from devicePlugin's values. Each DaemonSet adds its own flags and mounts.
*/}}

{{/* Pod-level settings (under spec.template.spec). */}}
{{- define "gpushare-hub.pluginPod" -}}
{{- if gt (float64 .Values.devicePlugin.usageInterval) 0.0 }}
# Usage readings map NVML's process IDs to pods through /proc/<pid>/cgroup.
hostPID: true
{{- end }}
{{- with .Values.devicePlugin.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.devicePlugin.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .Values.devicePlugin.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The flags after each plugin's own: cards, hook, MPS, usage, CDI, driver, backend. */}}
{{- define "gpushare-hub.pluginArgs" -}}
- --unit={{ .Values.resource.unit }}
- --node-config={{ .Release.Namespace }}/gpushare-node-options
- --hook-host-path={{ .Values.devicePlugin.hookHostPath }}
- --mps-root={{ .Values.devicePlugin.mpsRoot }}
- --hibernation-dir={{ .Values.devicePlugin.hibernationDir }}
- --usage-interval={{ .Values.devicePlugin.usageInterval }}
- --idle-memory-mib={{ .Values.devicePlugin.idleMemoryMiB }}
- --metrics-port={{ .Values.devicePlugin.metricsPort }}
- --log-level={{ .Values.devicePlugin.logLevel | default "INFO" }}
- --device-mode={{ .Values.devicePlugin.deviceMode | default "auto" }}
- --cdi-dir={{ .Values.devicePlugin.cdiDir | default "/var/run/cdi" }}
{{- if ne .Values.devicePlugin.deviceMode "legacy" }}
- --host-root=/host
{{- end }}
- --driver-root={{ .Values.devicePlugin.driverRoot | default "/" }}
- --containerd-config={{ .Values.devicePlugin.containerdConfig | default "/etc/containerd/config.toml" }}
{{- with .Values.devicePlugin.nvidiaCtk }}
- --nvidia-ctk={{ . }}
{{- end }}
{{- with .Values.devicePlugin.simulate }}
# Declared cards, no NVML: for trying the chart without GPUs, never in production.
- --backend=simulated
- {{ printf "--simulate=%s" . | quote }}
{{- end }}
{{- end }}

{{/* The container's environment: its node (downward API) and NVML through the NVIDIA runtime. */}}
{{- define "gpushare-hub.pluginEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef: {fieldPath: spec.nodeName}
{{- if not .Values.devicePlugin.simulate }}
# NVML through the NVIDIA runtime: the plugin sees every card of its node.
- {name: NVIDIA_VISIBLE_DEVICES, value: all}
- {name: NVIDIA_DRIVER_CAPABILITIES, value: utility}
{{- end }}
{{- end }}

{{/* Container settings after env: security, metrics port, resources. */}}
{{- define "gpushare-hub.pluginContainer" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- if .Values.devicePlugin.metricsPort }}
ports:
  - {name: metrics, containerPort: {{ .Values.devicePlugin.metricsPort }}}
{{- end }}
{{- with .Values.devicePlugin.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The shared mounts (after each plugin's own). */}}
{{- define "gpushare-hub.pluginMounts" -}}
# Host folders that Allocate mounts into GPU containers: the plugin fills them at
# the same path as on the host, because the kubelet mounts host paths.
{{- with .Values.devicePlugin.hookHostPath }}
- {name: pyhook, mountPath: {{ . }}}
{{- end }}
- {name: mps, mountPath: {{ .Values.devicePlugin.mpsRoot }}, readOnly: true}
- {name: hibernation, mountPath: {{ .Values.devicePlugin.hibernationDir }}}
# The plugin's CDI spec (cdi mode), written where the runtime reads specs.
- {name: cdi, mountPath: {{ .Values.devicePlugin.cdiDir | default "/var/run/cdi" }}}
{{- if ne .Values.devicePlugin.deviceMode "legacy" }}
# The host's root, read-only: its nvidia-ctk runs against the host's driver, and
# containerd's config says whether CDI is on and which runtime is the default.
- {name: host-root, mountPath: /host, readOnly: true}
{{- end }}
# nvidia-ctk's scratch files (the root filesystem is read-only).
- {name: tmp, mountPath: /tmp}
{{- end }}

{{/* The volumes of the shared mounts. */}}
{{- define "gpushare-hub.pluginVolumes" -}}
{{- with .Values.devicePlugin.hookHostPath }}
- name: pyhook
  hostPath: {path: {{ . }}, type: DirectoryOrCreate}
{{- end }}
- name: mps
  hostPath: {path: {{ .Values.devicePlugin.mpsRoot }}, type: DirectoryOrCreate}
- name: hibernation
  hostPath: {path: {{ .Values.devicePlugin.hibernationDir }}, type: DirectoryOrCreate}
- name: cdi
  hostPath: {path: {{ .Values.devicePlugin.cdiDir | default "/var/run/cdi" }}, type: DirectoryOrCreate}
{{- if ne .Values.devicePlugin.deviceMode "legacy" }}
- name: host-root
  hostPath: {path: /, type: Directory}
{{- end }}
- name: tmp
  emptyDir: {sizeLimit: 64Mi}
{{- end }}

{{/* The device plugin keeps off the DRA nodes: any label of dra.nodeSelector that differs. */}}
{{- define "gpushare-hub.notDRANodes" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      {{- range $key, $value := .Values.dra.nodeSelector }}
      - matchExpressions:
          - {key: {{ $key | quote }}, operator: NotIn, values: [{{ $value | quote }}]}
      {{- end }}
{{- end }}
