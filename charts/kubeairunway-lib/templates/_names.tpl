{{/*
Names, labels and the image, shared by every kubeairunway chart.

Most helpers take a context dict:
  root       the chart's top-level context ($)
  values     the component's values (.Values for a one-component chart, or e.g.
             .Values.controller): the shared workload keys (replicaCount, leaderElection,
             serviceAccount, metrics, extraArgs, extraEnv, podLabels, podAnnotations,
             podSecurityContext, securityContext, resources, nodeSelector, tolerations,
             affinity, priorityClassName)
  component  the app.kubernetes.io/component label (controller, agent, webhook, provider)
  name       the object name of the component's workload
*/}}

{{/* The chart's name: nameOverride, else the chart's. Takes the root context. */}}
{{- define "kubeairunway-lib.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: fullnameOverride, else <release>-<name> (or the release name
when it contains the chart's name). Takes the root context. */}}
{{- define "kubeairunway-lib.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of a component. Takes (dict "root" $ "component" "...") */}}
{{- define "kubeairunway-lib.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubeairunway-lib.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Labels of every object of a component. Takes (dict "root" $ "component" "...") */}}
{{- define "kubeairunway-lib.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kubeairunway-lib.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: kubeairunway
{{- end -}}

{{/* The platform's image: every binary is in it, each container runs its own. Tag
defaults to the chart's appVersion (the release without a "v": 0.1.0); a digest, when
set, pins it. Takes the root context. */}}
{{- define "kubeairunway-lib.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The component's ServiceAccount name. Takes the context dict; .name is the default. */}}
{{- define "kubeairunway-lib.serviceAccountName" -}}
{{- if .values.serviceAccount.create -}}
{{- default .name .values.serviceAccount.name -}}
{{- else -}}
{{- required (printf "%s: serviceAccount.name is required when serviceAccount.create is false" .component) .values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The component's ServiceAccount, when serviceAccount.create. */}}
{{- define "kubeairunway-lib.serviceAccount" -}}
{{- if .values.serviceAccount.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "kubeairunway-lib.serviceAccountName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "kubeairunway-lib.labels" . | nindent 4 }}
  {{- with .values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end -}}
