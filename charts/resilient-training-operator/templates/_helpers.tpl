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

{{/* The Secret holding the operator's plan-signing key (templates/plan-key.yaml, RTJ_PLAN_KEY_SECRET). */}}
{{- define "rto.planKeySecret" -}}
{{- .Values.planDelivery.keySecret | default (printf "%s-plan-key" (include "rto.fullname" . | trunc 54 | trimSuffix "-")) }}
{{- end }}

{{/*
The operator's rights on namespaced objects: in the ClusterRole when every namespace is watched, in a
Role per namespace when watchNamespaces is set. Every verb is something the operator does.
*/}}
{{- define "rto.namespacedRules" -}}
# The jobs: watched into the operator's cache (list + watch). It never changes a job's spec, and never
# reads one by name (no get): every read comes from the cache.
- apiGroups: ["training.resilient.dev"]
  resources: ["resilienttrainingjobs"]
  verbs: ["list", "watch"]
# Status: the operator is the only writer of a job's status (one patch per reconcile). Never grant
# tenants this subresource: status is what the operator trusts (attempt, history, bad nodes).
- apiGroups: ["training.resilient.dev"]
  resources: ["resilienttrainingjobs/status"]
  verbs: ["patch"]
# Worker pods: create a gang; delete (force-delete on lost nodes) to fence a broken attempt; list +
# watch into the cache (failures, deletions); patch the labels and annotations of a pod kept by an
# in-place restart once its agent took the next attempt's plan (delivery.py; guarded by the pod's uid).
# No get: nothing reads a pod by name.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete", "patch"]
# The headless rendezvous Service of each job (created once, owned by the job; garbage-collected
# with it, so no delete; AlreadyExists is fine, so no get).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create"]
# Events on the jobs, so `kubectl describe rtj` tells the story (node lost, restarted 4 -> 3
# from step N); kopf posts its own events the same way (create only).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# The attempt's PodDisruptionBudget (maxUnavailable 0): `kubectl drain` waits while the operator stops
# the whole gang gracefully itself, instead of evicting rank by rank. Created with each attempt, deleted
# when the next one starts or the job ends (owned by the job, so garbage-collected with it too).
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "delete"]
{{- if .Values.kueue.enabled }}
# Kueue (kueue.enabled): a job labelled kueue.x-k8s.io/queue-name is represented by a Workload the operator
# creates and owns: watched (list + watch) for admission and eviction; deleted when it is replaced by a new
# admission (garbage collection removes it with the job).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch", "create", "delete"]
# Its status, as Kueue's job integrations write it: quota released after an eviction, Finished,
# reclaimablePods (workers given up after a node loss), PodsReady.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- end }}

{{/*
A memory quantity in bytes ("1536Mi", "2Gi", "1610612736"), or "" for a form this check does not read
(then the check is skipped; Kubernetes still validates the quantity).
*/}}
{{- define "rto.quantityBytes" -}}
{{- $q := toString . }}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?([eE][+-]?[0-9]+)?" $q }}
{{- $units := dict "" 1.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 }}
{{- $suffix := trimPrefix $num $q }}
{{- if and $num (hasKey $units $suffix) }}
{{- mulf (float64 $num) (get $units $suffix) }}
{{- end }}
{{- end }}

{{/*
Cross-value checks the schema cannot express; the render fails with the reason.
- The memory limit holds the operator (budgeted at 256 MiB) plus every discovery worker at its
  address-space limit: a worker that hits RLIMIT_AS fails alone, but workers that together exceed the
  container's limit would get the operator itself OOM-killed.
- A .metadata file is read whole and unpickled inside a worker: the size cap must leave the worker
  room (at most a quarter of its memory).
- Every namespace storage area lies under the checkpoint mount.
- Leader election: retry period < renew deadline < lease duration (client-go's rule).
*/}}
{{- define "rto.validate" -}}
{{- $le := .Values.leaderElection }}
{{- if not (and (lt (int $le.retryPeriodSeconds) (int $le.renewDeadlineSeconds)) (lt (int $le.renewDeadlineSeconds) (int $le.leaseDurationSeconds))) }}
{{- fail (printf "leaderElection: retryPeriodSeconds (%v) < renewDeadlineSeconds (%v) < leaseDurationSeconds (%v) is required: a leader must stop writing before a standby may take the Lease" $le.retryPeriodSeconds $le.renewDeadlineSeconds $le.leaseDurationSeconds) }}
{{- end }}
{{- $d := .Values.discovery }}
{{- $workerBytes := float64 $d.workerMemoryBytes }}
{{- with (.Values.resources.limits | default dict).memory }}
{{- $limit := include "rto.quantityBytes" . }}
{{- if $limit }}
{{- $need := addf 268435456.0 (mulf (float64 $d.workers) $workerBytes) }}
{{- if lt (float64 $limit) $need }}
{{- fail (printf "resources.limits.memory (%v) must be at least 256Mi + discovery.workers (%v) x discovery.workerMemoryBytes (%v) = %.0f bytes" . $d.workers (int64 $d.workerMemoryBytes) $need) }}
{{- end }}
{{- end }}
{{- end }}
{{- if gt (mulf (float64 $d.metadataMaxBytes) 4.0) $workerBytes }}
{{- fail (printf "discovery.metadataMaxBytes (%v) must be at most a quarter of discovery.workerMemoryBytes (%v)" (int64 $d.metadataMaxBytes) (int64 $d.workerMemoryBytes)) }}
{{- end }}
{{- $mount := trimSuffix "/" .Values.checkpointStorage.mountPath }}
{{- range $ns, $area := .Values.checkpointStorage.namespaceAreas }}
{{- if not (hasPrefix (printf "%s/" $mount) $area) }}
{{- fail (printf "checkpointStorage.namespaceAreas.%s (%s) must lie under checkpointStorage.mountPath (%s)" $ns $area $mount) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The distinct Secrets named by objectStorage.areas: each is mounted read-only at
/etc/resilient-training/object-store/<secret>/ (RTJ_OBJECT_STORE_SECRETS_DIR), where the operator reads
the area's keys at each discovery. One list, used for the volumes and their mounts alike.
*/}}
{{- define "rto.objectStoreSecrets" -}}
{{- $secrets := list }}
{{- range .Values.objectStorage.areas }}
{{- if .secret }}
{{- $secrets = append $secrets .secret }}
{{- end }}
{{- end }}
{{- toJson (uniq $secrets) }}
{{- end }}
