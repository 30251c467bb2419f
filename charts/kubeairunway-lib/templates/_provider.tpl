{{/*
A whole provider on the SDK runtime, as the KAITO, Dynamo and KubeRay charts install it
(and a fourth provider's chart can): ServiceAccount, ClusterRole with the rules every
provider needs plus its upstream kinds, its Lease's Role, the Deployment running the
provider binary with the runtime's flags, and an optional PodMonitor.

  {{- include "kubeairunway-lib.provider" (dict "root" $ "provider" "dynamo"
        "crd" "dynamographdeployments.nvidia.com"
        "args" "dynamo-provider.args" "rules" "dynamo-provider.rules") }}

  provider  the provider's name (its InferenceProviderConfig, field manager
            <provider>-provider, Lease <provider>-provider, binary /<provider>-provider)
  crd       the name of the CRD that would define its upstream kind (<plural>.<group>):
            the runtime watches that one CRD by name to detect the served version (for
            a built-in kind too, which no CRD defines, then asks discovery); omitted
            only for a kind of the core group, which has no CRDs
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

{{/* The rules every provider needs (sdk/README.md, the provider contract), each verb one
the runtime uses (tests/e2e/tests/e2e/providers_rbac.rs measures it): the ModelDeployments
it serves (read from a watch field-selected by status.provider.name; its finalizer added
and removed by patch; one read when one leaves the selection), its own status fields by
server-side apply, its own InferenceProviderConfig (created and kept by server-side apply,
which the API server authorizes as a create of that name) and its heartbeat, the one CRD
of its upstream kind (watched by name), the Warmups a ModelDeployment's spec.warmup names
(read from a watch cache: the warmup gate) and the one it makes for an inline spec.warmup
(created by server-side apply, deleted to be made again, when the ModelDeployment goes or
when spec.warmup is no longer inline); events come after the provider's own rules. */}}
{{- define "kubeairunway-lib.providerRules" -}}
- apiGroups: ["kubeairunway.ai"]
  resources: ["modeldeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["kubeairunway.ai"]
  resources: ["modeldeployments/status"]
  verbs: ["patch"]
- apiGroups: ["kubeairunway.ai"]
  resources: ["inferenceproviderconfigs"]
  resourceNames: [{{ .provider | quote }}]
  verbs: ["create", "patch"]
- apiGroups: ["kubeairunway.ai"]
  resources: ["inferenceproviderconfigs/status"]
  resourceNames: [{{ .provider | quote }}]
  verbs: ["patch"]
{{- with .crd }}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  resourceNames: [{{ . | quote }}]
  verbs: ["list", "watch"]
{{- end }}
- apiGroups: ["cache.kubeairunway.ai"]
  resources: ["warmups"]
  verbs: ["list", "watch", "create", "patch", "delete"]
{{- end -}}

{{/* Events about ModelDeployments (after the provider's own rules): created, and patched
when the same event repeats (kube's recorder counts a series). */}}
{{- define "kubeairunway-lib.eventRules" -}}
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
