{{/*
A component's pod and container, the same for every Deployment and DaemonSet of the
platform. Each takes the context dict described in _names.tpl.
*/}}

{{/* Pod template metadata: selector labels, podLabels, podAnnotations. */}}
{{- define "kubeairunway-lib.podMetadata" -}}
labels:
  {{- include "kubeairunway-lib.selectorLabels" . | nindent 2 }}
  {{- with .values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod spec fields other than containers and volumes. The ServiceAccount is
.serviceAccountName when given, else the component's serviceAccount values'. */}}
{{- define "kubeairunway-lib.podSpec" -}}
{{- $sa := .serviceAccountName -}}
{{- if not $sa -}}{{- $sa = include "kubeairunway-lib.serviceAccountName" . -}}{{- end -}}
serviceAccountName: {{ $sa }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The flags of the SDK's process runtime every binary shares (sdk/README.md, "One
process runtime"): metrics address, log format and, for components with a
leaderElection block, the Lease (.lease) and its timings. A chart puts the component's
extraArgs after all of its flags (a flag the chart sets cannot be given again: the
binaries refuse a repeated flag). */}}
{{- define "kubeairunway-lib.processArgs" -}}
- --metrics-bind-address=0.0.0.0:{{ .values.metrics.port }}
- --log-format={{ .root.Values.logFormat }}
{{- with .values.leaderElection }}
- --leader-elect={{ .enabled }}
- --leader-elect-resource-name={{ required "the component's Lease name" $.lease }}
- --leader-elect-lease-duration={{ .leaseDuration }}
- --leader-elect-renew-deadline={{ .renewDeadline }}
- --leader-elect-retry-period={{ .retryPeriod }}
{{- end }}
{{- end -}}

{{/* The container's environment: the pod's name and namespace (the process runtime's
--pod-name and --namespace), RUST_LOG from logLevel, then extraEnv. */}}
{{- define "kubeairunway-lib.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: RUST_LOG
  value: {{ .root.Values.logLevel | quote }}
{{- with .values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Container fields every component has: image, the metrics port (named "metrics":
/metrics, /healthz, /readyz), probes, resources, securityContext. Further ports go in
.ports (a list). */}}
{{- define "kubeairunway-lib.container" -}}
image: {{ include "kubeairunway-lib.image" .root | quote }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
ports:
  - name: metrics
    containerPort: {{ .values.metrics.port }}
    protocol: TCP
  {{- with .ports }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 20
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 10
{{- with .values.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A Prometheus Operator PodMonitor scraping the component's metrics port, when
metrics.podMonitor.enabled. */}}
{{- define "kubeairunway-lib.podMonitor" -}}
{{- with .values.metrics.podMonitor }}
{{- if .enabled }}
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: {{ $.name }}
  namespace: {{ $.root.Release.Namespace }}
  labels:
    {{- include "kubeairunway-lib.labels" $ | nindent 4 }}
    {{- with .labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "kubeairunway-lib.selectorLabels" $ | nindent 6 }}
  podMetricsEndpoints:
    - port: metrics
      path: /metrics
      {{- with .interval }}
      interval: {{ . }}
      {{- end }}
      {{- with .scrapeTimeout }}
      scrapeTimeout: {{ . }}
      {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Leader election: a Role for the component's one Lease (.lease) and its binding. */}}
{{- define "kubeairunway-lib.leaderElectionRbac" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .name }}-leader-election
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "kubeairunway-lib.labels" . | nindent 4 }}
rules:
  # create cannot be limited to a name; get and update can.
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["create"]
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: [{{ .lease | quote }}]
    verbs: ["get", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .name }}-leader-election
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "kubeairunway-lib.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .name }}-leader-election
subjects:
  - kind: ServiceAccount
    name: {{ include "kubeairunway-lib.serviceAccountName" . }}
    namespace: {{ .root.Release.Namespace }}
{{- end -}}

{{/* A ClusterRole (.rules, a list) and its binding to the component's ServiceAccount. */}}
{{- define "kubeairunway-lib.clusterRole" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ .name }}
  labels:
    {{- include "kubeairunway-lib.labels" . | nindent 4 }}
rules:
  {{- toYaml .rules | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .name }}
  labels:
    {{- include "kubeairunway-lib.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ include "kubeairunway-lib.serviceAccountName" . }}
    namespace: {{ .root.Release.Namespace }}
{{- end -}}

{{/* A NetworkPolicy for a webhook's pods (values: a networkPolicy block): the webhook
port only from .networkPolicy.apiServer, the metrics port only from .metricsFrom. Takes
the context dict of _names.tpl plus "name", "networkPolicy", "webhookPort" and
"metricsPort". */}}
{{- define "kubeairunway-lib.webhookNetworkPolicy" -}}
{{- $np := .networkPolicy -}}
{{- if $np.enabled }}
{{- if not $np.apiServer }}
{{- fail "networkPolicy.apiServer: name the API server's addresses (an ipBlock of the control plane, or a konnectivity agent's pods) before enabling the NetworkPolicy, or every admission the webhook takes part in is refused" }}
{{- end }}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "kubeairunway-lib.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "kubeairunway-lib.selectorLabels" . | nindent 6 }}
  policyTypes: [Ingress]
  ingress:
    - from:
        {{- toYaml $np.apiServer | nindent 8 }}
      ports:
        - port: {{ .webhookPort }}
          protocol: TCP
    {{- with $np.metricsFrom }}
    - from:
        {{- toYaml . | nindent 8 }}
      ports:
        - port: {{ $.metricsPort }}
          protocol: TCP
    {{- end }}
{{- end }}
{{- end -}}
