{{/*
A whole provider on the SDK runtime, as the KAITO, Dynamo and KubeRay charts install it
(and a fourth provider's chart can): ServiceAccount, ClusterRole with the rules every
provider needs plus its upstream kinds, its Lease's Role, the Deployment running the
provider binary with the runtime's flags, and an optional PodMonitor.

  {{- include "kubeairunway-lib.provider" (dict "root" $ "provider" "dynamo"
        "args" "dynamo-provider.args" "rules" "dynamo-provider.rules") }}

  provider  the provider's name (its InferenceProviderConfig, field manager
            <provider>-provider, Lease <provider>-provider, binary /<provider>-provider)
  args      (optional) a template rendering the provider's own flags as a YAML list
  rules     (optional) a template rendering the RBAC rules of what it renders (its
            upstream kinds and supporting objects) as a YAML list
  command   (optional) the container's command; default ["/<provider>-provider"]

The chart's values are the shared ones (values.schema.json of the KAITO chart shows
them all) plus runtime.{finalizerTimeout,staleStatusAfter,heartbeatInterval,resyncPeriod}.
*/}}
{{- define "kubeairunway-lib.provider" -}}
{{- $root := .root -}}
{{- $ctx := dict "root" $root "values" $root.Values "component" "provider" "name" (include "kubeairunway-lib.fullname" $root) "lease" (printf "%s-provider" .provider) -}}
{{- $rules := list -}}
{{- if .rules }}{{- $rules = include .rules $root | fromYamlArray -}}{{- end -}}
{{- $all := concat (include "kubeairunway-lib.providerRules" . | fromYamlArray) $rules (include "kubeairunway-lib.eventRules" . | fromYamlArray) -}}
{{- with (include "kubeairunway-lib.serviceAccount" $ctx) }}
{{ . }}
---
{{- end }}
{{ include "kubeairunway-lib.clusterRole" (merge (dict "rules" $all) $ctx) }}
---
{{ include "kubeairunway-lib.leaderElectionRbac" $ctx }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $ctx.name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kubeairunway-lib.labels" $ctx | nindent 4 }}
spec:
  # With leader election, one replica reconciles; the others take over when it goes.
  replicas: {{ $root.Values.replicaCount }}
  selector:
    matchLabels:
      {{- include "kubeairunway-lib.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      {{- include "kubeairunway-lib.podMetadata" $ctx | nindent 6 }}
    spec:
      {{- include "kubeairunway-lib.podSpec" $ctx | nindent 6 }}
      containers:
        - name: provider
          command: {{ default (list (printf "/%s-provider" .provider)) .command | toJson }}
          args:
            {{- if .args }}
            {{- include .args $root | nindent 12 }}
            {{- end }}
            {{- with $root.Values.runtime }}
            - --finalizer-timeout={{ .finalizerTimeout }}
            - --stale-status-after={{ .staleStatusAfter }}
            - --heartbeat-interval={{ .heartbeatInterval }}
            - --resync-period={{ .resyncPeriod }}
            - --cluster-domain={{ .clusterDomain }}
            {{- end }}
            {{- include "kubeairunway-lib.processArgs" $ctx | nindent 12 }}
            {{- with $root.Values.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          env:
            {{- include "kubeairunway-lib.env" $ctx | nindent 12 }}
          {{- include "kubeairunway-lib.container" $ctx | nindent 10 }}
{{- with (include "kubeairunway-lib.podMonitor" $ctx) }}
---
{{ . }}
{{- end }}
{{- end -}}

{{/* The rules every provider needs (sdk/README.md, the provider contract): the
ModelDeployments it serves (field-selected by status.provider.name) with its finalizer,
its own status fields by server-side apply, its InferenceProviderConfig and heartbeat,
the installed upstream CRD and its schema, the Warmups a ModelDeployment's spec.warmup
names (read from a watch cache: the warmup gate); events come after the provider's own
rules. */}}
{{- define "kubeairunway-lib.providerRules" -}}
- apiGroups: ["kubeairunway.ai"]
  resources: ["modeldeployments"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["kubeairunway.ai"]
  resources: ["modeldeployments/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["kubeairunway.ai"]
  resources: ["inferenceproviderconfigs", "inferenceproviderconfigs/status"]
  verbs: ["get", "create", "patch", "update"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["cache.kubeairunway.ai"]
  resources: ["warmups"]
  verbs: ["list", "watch"]
{{- end -}}

{{/* Events about ModelDeployments (after the provider's own rules). */}}
{{- define "kubeairunway-lib.eventRules" -}}
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
