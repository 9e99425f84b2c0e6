{{/* Names and labels. Helm's subset here: see tests/deploy/helm_render.py. */}}
{{- define "rvd.name" -}}
{{ .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rvd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{ .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains .Chart.Name .Release.Name -}}
{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}
{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The labels every object carries. */}}
{{- define "rvd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{ include "rvd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* What a Service or a DaemonSet selects rvd's pods by. */}}
{{- define "rvd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rvd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end }}

{{- define "rvd.checkMode" -}}
{{- if not (or (eq .Values.mode "sidecar") (eq .Values.mode "daemonset")) -}}
{{ fail "mode must be sidecar or daemonset" }}
{{- end -}}
{{- if not (int .Values.daemonset.instancesPerNode) -}}
{{ fail "daemonset.instancesPerNode must be 1 or more" }}
{{- end -}}
{{- end }}

{{/* The rvd container, the same in both modes: the DaemonSet's containers
     and the init container of the sidecar snippet. Its data is a dict:
     Values, Chart, Release (the root's), instance (0 .. n-1) and multi
     (n > 1: one rvd per GPU, daemonset.instancesPerNode). */}}
{{- define "rvd.container" -}}
name: {{ if .multi }}{{ printf "rvd-%d" .instance }}{{ else }}rvd{{ end }}
image: {{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- if .multi }}
args: ["--config", "/etc/rvd/rvd.yaml",
       "--grpc-address", {{ printf "0.0.0.0:%d" (add .Values.ports.grpc .instance) | quote }},
       "--metrics-address", {{ printf "0.0.0.0:%d" (add .Values.ports.metrics .instance) | quote }}]
{{- else }}
args: ["--config", "/etc/rvd/rvd.yaml"]
{{- end }}
{{- if or .Values.env (and (eq .Values.mode "daemonset") .Values.daemonset.visibleDevices) }}
env:
  {{- if and (eq .Values.mode "daemonset") .Values.daemonset.visibleDevices }}
  - name: NVIDIA_VISIBLE_DEVICES
    value: {{ if .multi }}{{ printf "%d" .instance | quote }}{{ else }}{{ .Values.daemonset.visibleDevices | quote }}{{ end }}
  - name: NVIDIA_DRIVER_CAPABILITIES
    value: compute,utility
  {{- end }}
  {{- with .Values.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
ports:
  - name: {{ include "rvd.portName" (dict "name" "grpc" "multi" .multi "instance" .instance) }}
    containerPort: {{ add .Values.ports.grpc .instance }}
  - name: {{ include "rvd.portName" (dict "name" "metrics" "multi" .multi "instance" .instance) }}
    containerPort: {{ add .Values.ports.metrics .instance }}
startupProbe:
  grpc:
    port: {{ add .Values.ports.grpc .instance }}
  {{- toYaml .Values.probes.startup | nindent 2 }}
readinessProbe:
  grpc:
    port: {{ add .Values.ports.grpc .instance }}
  {{- toYaml .Values.probes.readiness | nindent 2 }}
livenessProbe:
  grpc:
    port: {{ add .Values.ports.grpc .instance }}
  {{- toYaml .Values.probes.liveness | nindent 2 }}
resources:
  {{- if and (eq .Values.mode "sidecar") .Values.sidecar.gpuClaimName }}
  claims:
    - name: {{ .Values.sidecar.gpuClaimName }}
  {{- end }}
  {{- toYaml .Values.resources | nindent 2 }}
securityContext:
  runAsNonRoot: true
  runAsUser: {{ .Values.runAsUser }}
  runAsGroup: {{ .Values.runAsGroup }}
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
    {{- if .Values.sysPtrace }}
    add: ["SYS_PTRACE"]
    {{- end }}
volumeMounts:
  - name: rvd-config
    mountPath: /etc/rvd
    readOnly: true
  - name: rvd-data
    mountPath: /var/lib/rvd
    {{- if .multi }}
    subPath: {{ printf "gpu-%d" .instance }}
    {{- end }}
  - name: rvd-tmp
    mountPath: /tmp
    {{- if .multi }}
    subPath: {{ printf "gpu-%d" .instance }}
    {{- end }}
  - name: dshm
    mountPath: /dev/shm
  {{- if or (and (eq .Values.mode "daemonset") .Values.checkpoints.hostPath) (and (eq .Values.mode "sidecar") .Values.checkpoints.volumeName) }}
  - name: {{ .Values.checkpoints.volumeName | default "checkpoints" }}
    mountPath: {{ .Values.checkpoints.mountPath }}
    readOnly: true
  {{- end }}
{{- end }}

{{/* "true" when daemonset mode runs several rvd per node (one per GPU),
     else "". */}}
{{- define "rvd.multi" -}}
{{ if and (eq .Values.mode "daemonset") (ne (int .Values.daemonset.instancesPerNode) 1) }}true{{ end }}
{{- end }}

{{/* A port's name: grpc and metrics, or grpc-i and metrics-i for instance i
     of several (each at most 15 characters, as Kubernetes requires). */}}
{{- define "rvd.portName" -}}
{{ if .multi }}{{ printf "%s-%d" .name .instance }}{{ else }}{{ .name }}{{ end }}
{{- end }}

{{/* The volumes rvd's container mounts (dshm: shared with the trainer in
     sidecar mode; the checkpoint volume there is the trainer's own). */}}
{{- define "rvd.volumes" -}}
- name: rvd-config
  configMap:
    name: {{ include "rvd.fullname" . }}
- name: rvd-data
  {{- if and (eq .Values.mode "daemonset") .Values.data.hostPath }}
  hostPath:
    path: {{ .Values.data.hostPath }}
    type: DirectoryOrCreate
  {{- else }}
  emptyDir: {}
  {{- end }}
- name: rvd-tmp
  emptyDir: {}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shm.sizeLimit }}
{{- if and (eq .Values.mode "daemonset") .Values.checkpoints.hostPath }}
- name: {{ .Values.checkpoints.volumeName | default "checkpoints" }}
  hostPath:
    path: {{ .Values.checkpoints.hostPath }}
    type: Directory
{{- end }}
{{- end }}
