{{/*
Names and labels shared by every template.
*/}}

{{- define "rto.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name: the release name, plus the chart name unless the release name contains it.
Truncated to 63 characters (DNS label); "-metrics" is added to it for the Service, so it is kept to 55.
*/}}
{{- define "rto.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rto.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: immutable on a Deployment, so only name and instance. */}}
{{- define "rto.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rto.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rto.labels" -}}
helm.sh/chart: {{ include "rto.chart" . }}
{{ include "rto.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: resilient-training
{{- end }}

{{- define "rto.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rto.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rto.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Checkpoint storage: fails the render when both sources are set (the schema rejects it too; this
message is for charts embedded as a subchart with schema checks skipped).
*/}}
{{- define "rto.checkpointVolume" -}}
{{- $s := .Values.checkpointStorage }}
{{- if and $s.existingClaim $s.hostPath }}
{{- fail "checkpointStorage: set existingClaim or hostPath, not both" }}
{{- end }}
{{- if $s.existingClaim }}
- name: checkpoints
  persistentVolumeClaim:
    claimName: {{ $s.existingClaim | quote }}
    readOnly: true
{{- else if $s.hostPath }}
- name: checkpoints
  hostPath:
    path: {{ $s.hostPath | quote }}
    type: Directory
{{- end }}
{{- end }}
